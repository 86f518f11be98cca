//! Instances of the frozen, slotted dataclasses of `sniffer.core.events`
//! (and the other values `sniffer.llm.values.slot_init` speeds up) made
//! without a Python frame: the one place that reaches past PyO3 for it.
//!
//! Calling such a class costs a Python `__init__` frame and, per field, a
//! call of its slot descriptor's `__set__` (a method wrapper, through the
//! generic call path: ~800 instructions each): ~6.5k instructions for an
//! `HttpRequest` of seven fields, ~14k for a `StreamOpened` of seventeen.
//! Both end in the same two C functions: the type's `tp_alloc` (what
//! `object.__new__` calls for a class without `__new__`) and the member
//! descriptors' `tp_descr_set` (what `__set__`, and `object.__setattr__`
//! once it found the descriptor, call; the frozen class's own
//! `__setattr__` refuses). [`SlotClass::make`] calls them directly (~1k for
//! seven fields); [`SlotFiller`] gives a Python `__init__` the second one
//! (`slot_init` uses it while the native core runs: one call for every
//! field). The object is the one the class call makes: same type, slots and
//! values, tracked by the cycle collector as `tp_alloc` leaves it.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

/// A frozen, slotted dataclass whose instances are made or filled here.
pub(crate) struct SlotClass {
    cls: Py<PyType>,
    /// the slot descriptor of each field (`cls.__dict__[name]`, a
    /// `member_descriptor`), in field order (`dataclasses.fields`)
    slots: Vec<Py<PyAny>>,
    /// each field's default (None: it has none, or a default factory)
    defaults: Vec<Option<Py<PyAny>>>,
    /// the class's `tp_alloc`
    alloc: pyo3::ffi::allocfunc,
    /// `member_descriptor`'s `tp_descr_set`
    set: pyo3::ffi::descrsetfunc,
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
        return Err(PyErr::take(py)
            .unwrap_or_else(|| PyTypeError::new_err(format!("{tp} has no type slot {slot}"))));
    }
    Ok(ptr)
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
        Ok(SlotClass {
            cls: cls.clone().unbind(),
            slots,
            defaults,
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
        for (i, slot) in self.slots.iter().enumerate() {
            match (values.get(i), &self.defaults[i]) {
                (Some(value), _) => self.set(py, slot, &obj, value)?,
                (None, Some(default)) => self.set(py, slot, &obj, default.bind(py))?,
                (None, None) => return self.check_len(py, values.len()).map(|()| obj),
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
