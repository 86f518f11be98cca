//! Instances of `__slots__` classes reached past PyO3's generic attribute
//! access: the one place that does it.
//!
//! [`Slots`]: the slots of a class's instances read and written where their
//! member descriptors keep them: the streams stage's `_Exchange` (`chunks`),
//! the events the recording chain reads (`observe`).
//!
//! [`SlotClass`]: instances of the frozen, slotted dataclasses of
//! `sniffer.core.events` (and the other values `sniffer.llm.values.slot_init`
//! speeds up) made without a Python frame.
//!
//! Calling such a class costs a Python `__init__` frame and, per field, a
//! call of its slot descriptor's `__set__` (a method wrapper, through the
//! generic call path: ~800 instructions each): ~6.5k instructions for an
//! `HttpRequest` of seven fields, ~14k for a `StreamOpened` of seventeen.
//! Both end in the same two C functions: the type's `tp_alloc` (what
//! `object.__new__` calls for a class without `__new__`) and the member
//! descriptors' `tp_descr_set` (what `__set__`, and `object.__setattr__`
//! once it found the descriptor, call; the frozen class's own
//! `__setattr__` refuses). [`SlotClass::make`] calls the first and stores
//! the values where the second would (~1k for seven fields); [`SlotFiller`] gives a Python `__init__` the second one
//! (`slot_init` uses it while the native core runs: one call for every
//! field). The object is the one the class call makes: same type, slots and
//! values, tracked by the cycle collector as `tp_alloc` leaves it.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyType};
use pyo3::IntoPyObjectExt;

/// Slots of one class (by index, in the order of the names given) read and
/// written without `getattr` / `setattr` (~150 instructions of look-up of
/// the name in the type per access), where each slot's member descriptor
/// (`cls.__dict__[name]`) keeps its value: a word of the instance at an
/// offset found once (`probe`). A set slot is read there as the descriptor
/// type's `tp_descr_get` (what `getattr` calls once it found the
/// descriptor) reads it: the object, a new reference (~60 instructions
/// through `tp_descr_get`, ~10 so); an unset one through `tp_descr_get`,
/// which raises AttributeError. A slot is written there as `tp_descr_set`
/// writes it (~35 instructions less than calling it). Only for an object of
/// exactly that type (a slotted class with the generic attribute access,
/// checked once: no instance `__dict__`, and a data descriptor wins over
/// anything else; its layout is the one probed), so what is read and
/// written is what `getattr` and `setattr` would; any other object (a
/// subclass, a test's stand-in) goes through `getattr` / `setattr`.
pub(crate) struct Slots {
    cls: Py<PyType>,
    descrs: Vec<Py<PyAny>>,
    names: Vec<Py<PyString>>,
    /// where in an instance each slot's value is kept (bytes from its start)
    offsets: Vec<usize>,
    /// `member_descriptor`'s `tp_descr_get`
    get: pyo3::ffi::descrgetfunc,
    /// the class has the generic `setattr` (written here), not its own
    writable: bool,
}

impl Slots {
    /// The slots `names` of `cls`, in that order.
    pub(crate) fn new(py: Python<'_>, cls: &Bound<'_, PyType>, names: &[&str]) -> PyResult<Self> {
        if names.is_empty() {
            return Err(pyo3::exceptions::PyValueError::new_err("no slot names"));
        }
        // what `getattr` / `setattr` do is the descriptors' work only with
        // the generic attribute access (no `__getattribute__`, `__getattr__`
        // nor `__setattr__` of its own)
        let generic_get = type_slot(py, cls, pyo3::ffi::Py_tp_getattro)?
            == pyo3::ffi::PyObject_GenericGetAttr as *mut std::ffi::c_void;
        // (a frozen dataclass has a `__setattr__` of its own, which refuses:
        // its slots are only read here, `set` goes through `setattr`)
        let writable = type_slot(py, cls, pyo3::ffi::Py_tp_setattro)?
            == pyo3::ffi::PyObject_GenericSetAttr as *mut std::ffi::c_void;
        if !generic_get {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "{cls} must use the generic attribute access"
            )));
        }
        let dict = cls.getattr("__dict__")?;
        let mut descrs = Vec::with_capacity(names.len());
        let mut interned = Vec::with_capacity(names.len());
        for name in names {
            let name = PyString::intern(py, name);
            let descr = dict.get_item(&name)?;
            if descr.get_type().name()? != "member_descriptor" {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "{cls}.{name} must be a slot (a member descriptor)"
                )));
            }
            descrs.push(descr.unbind());
            interned.push(name.unbind());
        }
        let descr_type = descrs[0].bind(py).get_type();
        let get = type_slot(py, &descr_type, pyo3::ffi::Py_tp_descr_get)?;
        let set = type_slot(py, &descr_type, pyo3::ffi::Py_tp_descr_set)?;
        // SAFETY: by CPython's type slot definitions these slots hold
        // functions of exactly these types, non-null (checked by
        // `type_slot`); `member_descriptor` is a static type.
        #[allow(unsafe_code)]
        let (get, set) = unsafe {
            (
                std::mem::transmute::<*mut std::ffi::c_void, pyo3::ffi::descrgetfunc>(get),
                std::mem::transmute::<*mut std::ffi::c_void, pyo3::ffi::descrsetfunc>(set),
            )
        };
        let offsets = probe(py, cls, &descrs, set)?;
        Ok(Slots {
            cls: cls.clone().unbind(),
            descrs,
            names: interned,
            offsets,
            get,
            writable,
        })
    }
    /// Whether `x` is exactly of the class.
    #[inline]
    pub(crate) fn exact(&self, x: &Bound<'_, PyAny>) -> bool {
        std::ptr::eq(x.get_type_ptr(), self.cls.as_ptr().cast())
    }

    /// The value of `slot` of `x`, borrowed (None: unset, or `x` is not
    /// exactly of the class).
    #[inline]
    pub(crate) fn peek(
        &self,
        x: &Bound<'_, PyAny>,
        slot: usize,
    ) -> Option<*mut pyo3::ffi::PyObject> {
        if !self.exact(x) {
            return None;
        }
        // SAFETY: `x` is a live instance of exactly the class (checked
        // above) and the GIL is held: its memory holds at least
        // `__basicsize__` initialised bytes, and the offset, found by
        // `probe`, is an aligned word inside them where the slot's
        // descriptor keeps the slot's value (a strong reference, or NULL when
        // unset), written only by code holding the GIL.
        #[allow(unsafe_code)]
        let ptr = unsafe {
            x.as_ptr()
                .cast::<u8>()
                .add(self.offsets[slot])
                .cast::<*mut pyo3::ffi::PyObject>()
                .read()
        };
        (!ptr.is_null()).then_some(ptr)
    }

    /// `getattr(x, slot) is None`.
    #[inline]
    pub(crate) fn is_none(&self, x: &Bound<'_, PyAny>, slot: usize) -> PyResult<bool> {
        match self.peek(x, slot) {
            Some(ptr) => Ok(std::ptr::eq(ptr, x.py().None().as_ptr())),
            None => Ok(self.get(x, slot)?.is_none()),
        }
    }

    /// `getattr(x, slot)`.
    #[inline]
    pub(crate) fn get<'py>(
        &self,
        x: &Bound<'py, PyAny>,
        slot: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = x.py();
        if let Some(ptr) = self.peek(x, slot) {
            // SAFETY: `ptr` is the slot's value, a live object that `x`
            // holds a reference to (`peek`); the GIL is held.
            #[allow(unsafe_code)]
            return Ok(unsafe { Bound::from_borrowed_ptr(py, ptr) });
        }
        let s = slot;
        if !self.exact(x) {
            return x.getattr(self.names[s].bind(py));
        }
        // SAFETY: the descriptor, `x` (exactly the descriptor's class) and
        // the class are live references for the whole call and the GIL is
        // held; `get` is the descriptor type's `tp_descr_get`, which borrows
        // its arguments, checks the instance's type and returns a new
        // reference or NULL with an exception set (an unset slot:
        // AttributeError, as `getattr`).
        #[allow(unsafe_code)]
        unsafe {
            let ptr = (self.get)(self.descrs[s].as_ptr(), x.as_ptr(), self.cls.as_ptr());
            if ptr.is_null() {
                return Err(PyErr::fetch(py));
            }
            Ok(Bound::from_owned_ptr(py, ptr))
        }
    }

    /// `setattr(x, slot, value)`.
    #[inline]
    pub(crate) fn set<'py, V: IntoPyObject<'py>>(
        &self,
        x: &Bound<'py, PyAny>,
        slot: usize,
        value: V,
    ) -> PyResult<()> {
        let py = x.py();
        let s = slot;
        let value = value.into_bound_py_any(py)?;
        if !self.writable || !self.exact(x) {
            return x.setattr(self.names[s].bind(py), value);
        }
        // SAFETY: `x` is a live instance of exactly the class and the GIL
        // is held; the word at the slot's offset is the slot's value (see
        // `peek`). What the descriptor's `tp_descr_set` does for a slot given
        // a value: the new value's reference stored (ours, handed over by
        // `into_ptr`), then the old one, if any, released (after the store,
        // as CPython does: its finaliser may run and see the new value).
        #[allow(unsafe_code)]
        unsafe {
            let addr = x
                .as_ptr()
                .cast::<u8>()
                .add(self.offsets[s])
                .cast::<*mut pyo3::ffi::PyObject>();
            let old = addr.read();
            addr.write(value.into_ptr());
            if !old.is_null() {
                pyo3::ffi::Py_DecRef(old);
            }
        }
        Ok(())
    }
}

/// Where in an instance of `cls` the member descriptors `descrs` keep their
/// values (bytes from the instance's start): each found by setting the slot
/// of a blank instance (`object.__new__(cls)`: every slot unset, NULL) to a
/// fresh object through the descriptor (`set`: its type's `tp_descr_set`)
/// and looking for the one word of the instance, within its
/// `__basicsize__`, that then holds it and holds NULL again once the slot is
/// deleted. An error if any is not found exactly so (a layout this reading
/// does not know).
pub(crate) fn probe(
    py: Python<'_>,
    cls: &Bound<'_, PyType>,
    descrs: &[Py<PyAny>],
    set: pyo3::ffi::descrsetfunc,
) -> PyResult<Vec<usize>> {
    let unknown =
        |what: &str| pyo3::exceptions::PyTypeError::new_err(format!("{cls}'s slots: {what}"));
    let word = std::mem::size_of::<*mut pyo3::ffi::PyObject>();
    let size: usize = cls.getattr("__basicsize__")?.extract()?;
    if cls.getattr("__itemsize__")?.extract::<usize>()? != 0 {
        return Err(unknown("a variable-size type"));
    }
    let obj = py
        .import("builtins")?
        .getattr("object")?
        .call_method1("__new__", (cls,))?;
    if !std::ptr::eq(obj.get_type_ptr(), cls.as_type_ptr()) {
        return Err(unknown("object.__new__ made another type"));
    }
    let words = size / word;
    // SAFETY: `obj` is a live instance of `cls` (checked above), kept for the
    // whole function, and the GIL is held: its memory holds `__basicsize__`
    // initialised bytes (`tp_alloc` zeroes them), aligned for words; `i` is
    // below `words`, so each read is of an aligned word inside them.
    #[allow(unsafe_code)]
    let read = |i: usize| unsafe {
        obj.as_ptr()
            .cast::<*mut pyo3::ffi::PyObject>()
            .add(i)
            .read()
    };
    let mut offsets = Vec::with_capacity(descrs.len());
    for descr in descrs {
        // a fresh object: no other word of the instance can hold it
        let marker = PyTuple::new(py, [descr.bind(py)])?;
        // SAFETY: as in `chunk_event`: live descriptor, instance and value,
        // the GIL held; NULL as the value deletes the slot.
        #[allow(unsafe_code)]
        let rc = unsafe { set(descr.as_ptr(), obj.as_ptr(), marker.as_ptr()) };
        if rc != 0 {
            return Err(PyErr::fetch(py));
        }
        let hits: Vec<usize> = (0..words)
            .filter(|&i| std::ptr::eq(read(i), marker.as_ptr()))
            .collect();
        // SAFETY: as above.
        #[allow(unsafe_code)]
        let rc = unsafe { set(descr.as_ptr(), obj.as_ptr(), std::ptr::null_mut()) };
        if rc != 0 {
            return Err(PyErr::fetch(py));
        }
        match hits[..] {
            [i] if read(i).is_null() => offsets.push(i.saturating_mul(word)),
            _ => return Err(unknown("a slot's value not found in the instance")),
        }
    }
    Ok(offsets)
}

/// Type slot `slot` of `tp` (`PyType_GetSlot`): a function pointer, not
/// null (an error when the type has none).
pub(crate) fn type_slot(
    py: Python<'_>,
    tp: &Bound<'_, PyType>,
    slot: std::ffi::c_int,
) -> PyResult<*mut std::ffi::c_void> {
    // SAFETY: `tp` is a live type object and the GIL is held; `PyType_GetSlot`
    // returns the slot's value (NULL when unset) or NULL with an exception set
    // (a static type before 3.10: this module needs 3.11).
    #[allow(unsafe_code)]
    let ptr = unsafe { pyo3::ffi::PyType_GetSlot(tp.as_type_ptr(), slot) };
    if ptr.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err(format!("{tp} has no type slot {slot}"))
        }));
    }
    Ok(ptr)
}

/// A frozen, slotted dataclass whose instances are made or filled here.
pub(crate) struct SlotClass {
    cls: Py<PyType>,
    /// the slot descriptor of each field (`cls.__dict__[name]`, a
    /// `member_descriptor`), in field order (`dataclasses.fields`)
    slots: Vec<Py<PyAny>>,
    /// each field's default (None: it has none, or a default factory)
    defaults: Vec<Option<Py<PyAny>>>,
    /// where in an instance each field's slot keeps its value (bytes from
    /// its start), in field order (`probe`)
    offsets: Vec<usize>,
    /// the class's `tp_alloc`
    alloc: pyo3::ffi::allocfunc,
    /// `member_descriptor`'s `tp_descr_set`
    set: pyo3::ffi::descrsetfunc,
}

impl SlotClass {
    /// `cls`, checked: a dataclass whose every field is a slot, made by
    /// `object.__new__` (no `__new__` of its own) and set by nothing but
    /// its `__init__` (no `__post_init__`), so that setting the slots is all
    /// its construction does.
    pub(crate) fn new(py: Python<'_>, cls: &Bound<'_, PyType>) -> PyResult<Self> {
        let name = cls.qualname()?;
        let bad = |why: &str| PyTypeError::new_err(format!("{name}: {why}"));
        let object = py.import("builtins")?.getattr("object")?;
        if !cls.getattr("__new__")?.is(&object.getattr("__new__")?) {
            return Err(bad("has its own __new__"));
        }
        if cls.hasattr("__post_init__")? {
            return Err(bad("has a __post_init__"));
        }
        let dict = cls.getattr("__dict__")?;
        let dataclasses = py.import("dataclasses")?;
        let missing = dataclasses.getattr("MISSING")?;
        let mut slots = Vec::new();
        let mut defaults = Vec::new();
        for f in dataclasses.getattr("fields")?.call1((cls,))?.try_iter()? {
            let f = f?;
            let slot = dict
                .get_item(f.getattr("name")?)
                .map_err(|_| bad("a field is not a slot (member descriptor)"))?;
            if slot.get_type().name()? != "member_descriptor" {
                return Err(bad("a field is not a slot (member descriptor)"));
            }
            slots.push(slot.unbind());
            let default = f.getattr("default")?;
            defaults.push((!default.is(&missing)).then(|| default.unbind()));
        }
        let Some(first) = slots.first() else {
            return Err(bad("has no field"));
        };
        let alloc = type_slot(py, cls, pyo3::ffi::Py_tp_alloc)?;
        let set = type_slot(py, &first.bind(py).get_type(), pyo3::ffi::Py_tp_descr_set)?;
        // SAFETY: the values of these slots are, by CPython's type slot
        // definitions, functions of exactly these types (`allocfunc`,
        // `descrsetfunc`), non-null (checked by `type_slot`); the types they
        // belong to live as long as the interpreter (`cls` is kept here, the
        // descriptors' type is a static type).
        #[allow(unsafe_code)]
        let (alloc, set) = unsafe {
            (
                std::mem::transmute::<*mut std::ffi::c_void, pyo3::ffi::allocfunc>(alloc),
                std::mem::transmute::<*mut std::ffi::c_void, pyo3::ffi::descrsetfunc>(set),
            )
        };
        let offsets = probe(py, cls, &slots, set)?;
        Ok(SlotClass {
            cls: cls.clone().unbind(),
            slots,
            defaults,
            offsets,
            alloc,
            set,
        })
    }

    /// How many fields the class has.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// An error unless `n` values are given (one per field).
    fn check_len(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        if n == self.slots.len() {
            return Ok(());
        }
        Err(PyTypeError::new_err(format!(
            "{} takes {} field values, {n} given",
            self.cls.bind(py).qualname()?,
            self.slots.len(),
        )))
    }

    /// Set field `slot` of `obj` to `value`.
    fn set<'py>(
        &self,
        py: Python<'py>,
        slot: &Py<PyAny>,
        obj: &Bound<'py, PyAny>,
        value: &Bound<'py, PyAny>,
    ) -> PyResult<()> {
        // SAFETY: `slot` (a member descriptor), `obj` and `value` are live
        // references for the whole call and the GIL is held; `set` is the
        // descriptors' type's `tp_descr_set`, which checks that `obj` is an
        // instance of the descriptor's class (TypeError otherwise), borrows
        // its arguments (it steals no reference) and returns -1 with an
        // exception set on failure.
        #[allow(unsafe_code)]
        let rc = unsafe { (self.set)(slot.as_ptr(), obj.as_ptr(), value.as_ptr()) };
        if rc != 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(())
    }

    /// A new instance with these field values (in field order), the
    /// fields after them set to their defaults (an error for a field
    /// without one), as the class call with these positional arguments.
    /// Each value is stored in the word of the fresh instance where its
    /// slot's descriptor keeps it (`probe`), as `tp_descr_set` stores a value
    /// in an unset slot: the reference handed over, nothing to release
    /// (~50 instructions a field less than calling it).
    pub(crate) fn make<'py>(
        &self,
        py: Python<'py>,
        values: &[Bound<'py, PyAny>],
    ) -> PyResult<Bound<'py, PyAny>> {
        if values.len() > self.slots.len() {
            self.check_len(py, values.len())?;
        }
        let cls = self.cls.bind(py);
        // SAFETY: `cls` is a live type object and the GIL is held; `alloc`
        // is its own `tp_alloc` slot, read from it in `new`, which returns a
        // new reference or NULL with an exception set.
        #[allow(unsafe_code)]
        let obj = unsafe {
            let ptr = (self.alloc)(cls.as_type_ptr(), 0);
            if ptr.is_null() {
                return Err(PyErr::fetch(py));
            }
            Bound::from_owned_ptr(py, ptr)
        };
        if !std::ptr::eq(obj.get_type_ptr(), cls.as_type_ptr()) {
            return Err(PyTypeError::new_err(format!(
                "{}'s tp_alloc made another type",
                cls.qualname()?
            )));
        }
        for (i, &offset) in self.offsets.iter().enumerate() {
            let value = match (values.get(i), &self.defaults[i]) {
                (Some(value), _) => value.clone(),
                (None, Some(default)) => default.bind(py).clone(),
                (None, None) => return self.check_len(py, values.len()).map(|()| obj),
            };
            // SAFETY: `obj` is a live instance of exactly the class (checked
            // above), fresh from `tp_alloc` (which zeroes its `__basicsize__`
            // bytes: every slot unset, NULL) and not yet seen by other code;
            // the GIL is held. `offset`, found by `probe` on this class, is an
            // aligned word inside those bytes where the field's member
            // descriptor keeps its value, each field its own word, written
            // once here: the value's reference stored (ours, handed over by
            // `into_ptr`), no old one to release. On an early return the
            // object is released with the fields written so far, as a
            // partly set instance is.
            #[allow(unsafe_code)]
            unsafe {
                obj.as_ptr()
                    .cast::<u8>()
                    .add(offset)
                    .cast::<*mut pyo3::ffi::PyObject>()
                    .write(value.into_ptr());
            }
        }
        Ok(obj)
    }
}

/// Field values, each converted to a Python object (for [`SlotClass::make`]).
macro_rules! values {
    ($py:expr; $($v:expr),+ $(,)?) => {
        [$(pyo3::IntoPyObjectExt::into_bound_py_any($v, $py)?),+]
    };
}
pub(crate) use values;

/// `sniffer._native.SlotFiller(cls)`: ``fill(obj, *values)`` sets every
/// field of ``obj`` (an instance of ``cls``) to ``values``, in field order,
/// through the slot descriptors' C setter: what ``slot_init``'s generated
/// ``__init__`` calls once, instead of one descriptor call per field, while
/// the native core runs. ``make(*values)``: a new instance, as the class
/// call with those values makes it (the tests compare them).
#[pyclass(module = "sniffer._native", name = "SlotFiller", frozen)]
pub struct SlotFiller {
    class: SlotClass,
}

#[pymethods]
impl SlotFiller {
    #[new]
    fn new(py: Python<'_>, cls: &Bound<'_, PyType>) -> PyResult<Self> {
        Ok(SlotFiller {
            class: SlotClass::new(py, cls)?,
        })
    }

    #[pyo3(signature = (obj, *values))]
    fn fill<'py>(
        &self,
        py: Python<'py>,
        obj: &Bound<'py, PyAny>,
        values: &Bound<'py, PyTuple>,
    ) -> PyResult<()> {
        let class = &self.class;
        class.check_len(py, values.len())?;
        for (slot, value) in class.slots.iter().zip(values.iter()) {
            class.set(py, slot, obj, &value)?;
        }
        Ok(())
    }

    #[pyo3(signature = (*values))]
    fn make<'py>(
        &self,
        py: Python<'py>,
        values: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let values: Vec<Bound<'py, PyAny>> = values.iter().collect();
        self.class.make(py, &values)
    }

    /// How many fields the class has.
    fn __len__(&self) -> usize {
        self.class.len()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SlotFiller>()?;
    Ok(())
}
