//! OpenAI Chat Completions and Completions streamed chunks → deltas, for the
//! common case (the Python reference: `sniffer/llm/dialects/openai.py`,
//! `_OpenAIBase.event` and the `_choice` of `OpenAIChat` / `OpenAICompletions`).
//!
//! [`extract`] gives the reference's deltas for an item it can be sure of, and
//! `None` ("not mine": the Python reference handles the item) for everything
//! else. Taken: a JSON object of the [`crate::pyjson`] subset, with no
//! `error` (null counts as absent), no `"object": "error"`, and `choices`
//! absent, null, `[]` or a list of well-typed choice objects whose token ids
//! are in range. A wrong shape or an integer out of range (an INVALID delta in
//! the reference), the `[DONE]` marker and empty items are the reference's
//! too. A chunk's usage and server statistics (`usage`, `timings`, `metrics`,
//! `meta_info`) are handed back as values for the Python to read
//! (`Usage.parse`, `server_stats`) and put on the deltas.

use std::borrow::Cow;

use crate::pyjson::{self, Value};

/// Largest choice index (`sniffer.llm.values.INDEX_MAX`: a 32-bit column).
pub const INDEX_MAX: i64 = 2_147_483_647;
/// Largest token id (`sniffer.llm.values.TOKEN_ID_RANGE`: 32-bit unsigned).
pub const TOKEN_ID_MAX: i64 = 4_294_967_295;
/// `Delta.choice` of a stream-level delta (`sniffer.llm.dialects.base.STREAM_LEVEL`).
pub const STREAM_LEVEL: i64 = -1;

/// Which endpoint's chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`: `choices[].delta`.
    Chat,
    /// `/v1/completions`: `choices[].text`.
    Completions,
}

/// A delta's kind (`sniffer.llm.dialects.base`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Content,
    Reasoning,
    ToolCall,
    Finish,
    Role,
    Other,
}

/// One `Delta` (its `usage`, `error` and `server_tokens` are always None here).
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkDelta<'a> {
    /// The choice index, or [`STREAM_LEVEL`].
    pub choice: i64,
    pub kind: Kind,
    pub text: Cow<'a, str>,
    pub reasoning: Cow<'a, str>,
    /// JSON text of a non-empty `tool_calls` list.
    pub tool_calls: Option<String>,
    pub finish_reason: Option<Cow<'a, str>>,
    /// JSON text of the choice's `logprobs`.
    pub logprobs: Option<String>,
    /// `raw` is the item itself (OTHER deltas).
    pub raw: bool,
}

/// What one item gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk<'a> {
    pub deltas: Vec<ChunkDelta<'a>>,
    /// The reply's model and id as `JsonDialect._name` reads them (only when asked).
    pub model: Option<Cow<'a, str>>,
    pub id: Option<Cow<'a, str>>,
    /// The chunk's `usage`, `timings`, `metrics` and `meta_info` (null when
    /// absent), when one is not null: the Python reads them into the usage
    /// (`_with_usage`), which goes on the last delta (or makes a USAGE delta
    /// of a chunk without choices).
    pub server: Option<Box<[Value<'a>; 4]>>,
}

/// The reference's deltas for one streamed item, or `None` (not mine).
/// `want_name`: the dialect has not found the reply's model yet.
///
/// It reads the item in one pass, member by member ([`pyjson::Parser`]'s
/// walkers), building values only for the members read below and checking
/// the others without building them: the same rules as [`pyjson::parse`]
/// followed by a read of its tree (`extract_tree` in the tests, the
/// reference). Any `None` on the way is the item's: where a rule or a shape
/// fails first does not matter.
///
/// A chat chunk of the common shape is read by [`fast`] first, which takes
/// it or leaves it (at the first thing it does not know) to the general
/// reading, whose result it gives whenever it takes one.
pub fn extract(data: &str, endpoint: Endpoint, want_name: bool) -> Option<Chunk<'_>> {
    if endpoint == Endpoint::Chat {
        if let Some(chunk) = fast::chat(data, want_name) {
            return Some(chunk);
        }
    }
    general(data, endpoint, want_name)
}

/// [`extract`] without its fast path: every item, every rule.
fn general(data: &str, endpoint: Endpoint, want_name: bool) -> Option<Chunk<'_>> {
    let mut p = pyjson::Parser::new(data);
    p.ws();
    if p.peek()? != b'{' {
        return None;
    }
    let (mut model, mut id, mut nested_name) = (Value::Null, Value::Null, false);
    // `None`: no `choices` member (or null); else the deltas of its choices
    let mut deltas: Option<Vec<ChunkDelta<'_>>> = None;
    let mut server: [Value<'_>; 4] = [Value::Null, Value::Null, Value::Null, Value::Null];
    p.members(1, |p, key, d| {
        let slot = match key.as_ref() {
            "choices" => {
                if p.peek()? == b'[' {
                    let mut out = Vec::with_capacity(1);
                    p.items(d, |p, position, d| {
                        out.push(read_choice(p, d, position, endpoint)?);
                        Some(())
                    })?;
                    deltas = Some(out);
                    return Some(());
                }
                // null is no choices; anything else is not a list of them
                return null(p, d);
            }
            "model" => &mut model,
            "id" => &mut id,
            "message" | "response" => {
                // where JsonDialect._name looks when the top level has no model
                nested_name |= p.peek()? == b'{';
                return p.value::<false>(d).map(drop);
            }
            "object" => {
                let v = p.value::<false>(d)?;
                return (v.as_str() != Some("error")).then_some(());
            }
            "error" => return null(p, d),
            "usage" => &mut server[0],
            "timings" => &mut server[1],
            "metrics" => &mut server[2],
            "meta_info" => &mut server[3],
            _ => return p.value::<false>(d).map(drop),
        };
        *slot = p.value::<true>(d)?;
        Some(())
    })?;
    if !p.end() {
        return None;
    }
    let (mut name, mut name_id) = (None, None);
    if want_name {
        match model {
            Value::Str(m) if !m.is_empty() => {
                name = Some(m);
                if let Value::Str(i) = id {
                    name_id = (!i.is_empty()).then_some(i);
                }
            }
            _ if nested_name => return None,
            _ => {}
        }
    }
    let deltas = match deltas {
        Some(deltas) if !deltas.is_empty() => deltas,
        _ => vec![ChunkDelta {
            choice: STREAM_LEVEL,
            kind: Kind::Other,
            text: Cow::Borrowed(""),
            reasoning: Cow::Borrowed(""),
            tool_calls: None,
            finish_reason: None,
            logprobs: None,
            raw: true,
        }],
    };
    let server = server
        .iter()
        .any(|v| *v != Value::Null)
        .then(|| Box::new(server));
    Some(Chunk {
        deltas,
        model: name,
        id: name_id,
        server,
    })
}

/// The common chat chunk, read without building the general reading's
/// values: `{"id": …, "object": …, "model": …, "choices": [{"index": …,
/// "delta": {"content": …}, "finish_reason": …}]}` and the like, whatever
/// the members' order and the whitespace. It knows only these members
/// (written without escapes, each once): at the top level `id`, `model`
/// and `object` (strings), `choices` (a non-empty list of choice objects),
/// `usage` (null), `created`, `system_fingerprint`, `service_tier`,
/// `obfuscation` (any value, checked as the general reading checks
/// members it does not read); in a choice `index` (an integer), `delta`
/// (an object), `logprobs` (null), `finish_reason` (a string or null); in a
/// delta `content`, `role`, `reasoning_content`, `reasoning` (strings or
/// null), `tool_calls` (null), `refusal` (any value, checked). Anything
/// else (another member, another type, a missing `delta`, an empty list
/// or object where the general reading has a special case) leaves the item
/// to [`general`]: `None`. What it takes it reads with the same parser
/// (strings, numbers, whitespace, depth) and completes with the same
/// [`chat_delta`], so it gives exactly what `general` gives (the tests
/// compare the two on odd inputs).
pub(crate) mod fast {
    use std::borrow::Cow;

    use super::{chat_delta, Chunk, ChunkDelta, Kind, INDEX_MAX};
    use crate::pyjson::{Parser, Value};

    /// The top-level members it knows, in the order of [`top`]'s match.
    const TOP: [&[u8]; 9] = [
        b"id",
        b"object",
        b"model",
        b"choices",
        b"usage",
        b"created",
        b"system_fingerprint",
        b"service_tier",
        b"obfuscation",
    ];
    const CHOICE: [&[u8]; 4] = [b"index", b"delta", b"logprobs", b"finish_reason"];
    const DELTA: [&[u8]; 6] = [
        b"content",
        b"role",
        b"reasoning_content",
        b"reasoning",
        b"tool_calls",
        b"refusal",
    ];

    /// [`super::extract`] of a chat item, or `None` (left to `general`).
    pub(crate) fn chat(data: &str, want_name: bool) -> Option<Chunk<'_>> {
        let mut p = Parser::new(data);
        p.ws();
        let (mut id, mut model, mut deltas) = (None, None, None);
        // the top level is at depth 1, its members' values at 2
        object(&mut p, &TOP, false, |p, k| {
            match k {
                0 => id = Some(string(p)?),
                1 => {
                    if string(p)? == "error" {
                        return None;
                    }
                }
                2 => model = Some(string(p)?),
                3 => deltas = Some(choices(p)?),
                4 => null(p, 2)?,
                _ => {
                    p.value::<false>(2)?;
                }
            }
            Some(())
        })?;
        if !p.end() {
            return None;
        }
        let deltas = deltas?;
        let (mut name, mut name_id) = (None, None);
        if want_name {
            if let Some(m) = model.filter(|m| !m.is_empty()) {
                name = Some(m);
                name_id = id.filter(|i| !i.is_empty());
            }
        }
        Some(Chunk {
            deltas,
            model: name,
            id: name_id,
            server: None,
        })
    }

    /// The object at the cursor, none of whose members is missing from
    /// `keys` nor there twice: `member(parser, key's position)` reads each
    /// value. At least one member, unless `empty`.
    fn object<'a, F>(p: &mut Parser<'a>, keys: &[&[u8]], empty: bool, mut member: F) -> Option<()>
    where
        F: FnMut(&mut Parser<'a>, usize) -> Option<()>,
    {
        p.eat(b'{')?;
        if empty {
            p.ws();
            if p.peek()? == b'}' {
                p.bump();
                return Some(());
            }
        }
        let mut seen: u32 = 0;
        loop {
            p.ws();
            let k = p.plain_key(keys)?;
            let bit = 1_u32.checked_shl(u32::try_from(k).ok()?)?;
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            p.ws();
            p.eat(b':')?;
            p.ws();
            member(p, k)?;
            p.ws();
            match p.peek()? {
                b',' => p.bump(),
                b'}' => {
                    p.bump();
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string value.
    fn string<'a>(p: &mut Parser<'a>) -> Option<Cow<'a, str>> {
        (p.peek()? == b'"').then_some(())?;
        p.string()
    }

    /// A string or null value (`None` inside: null).
    fn string_or_null<'a>(p: &mut Parser<'a>, depth: usize) -> Option<Option<Cow<'a, str>>> {
        match p.peek()? {
            b'"' => p.string().map(Some),
            b'n' => null(p, depth).map(|()| None),
            _ => None,
        }
    }

    /// A null value.
    fn null(p: &mut Parser<'_>, depth: usize) -> Option<()> {
        (p.peek()? == b'n').then_some(())?;
        matches!(p.value::<false>(depth)?, Value::Null).then_some(())
    }

    /// The `choices` list (at depth 2): a delta per choice, at least one.
    fn choices<'a>(p: &mut Parser<'a>) -> Option<Vec<ChunkDelta<'a>>> {
        p.eat(b'[')?;
        let mut out = Vec::with_capacity(1);
        loop {
            p.ws();
            let position = out.len();
            out.push(choice(p, position)?);
            p.ws();
            match p.peek()? {
                b',' => p.bump(),
                b']' => {
                    p.bump();
                    return Some(out);
                }
                _ => return None,
            }
        }
    }

    /// The `position`-th choice (an object at depth 3, its values at 4).
    fn choice<'a>(p: &mut Parser<'a>, position: usize) -> Option<ChunkDelta<'a>> {
        let (mut index, mut finish, mut delta) = (None, None, None);
        object(p, &CHOICE, false, |p, k| {
            match k {
                0 => {
                    if !matches!(p.peek()?, b'-' | b'0'..=b'9') {
                        return None;
                    }
                    match p.value::<true>(4)? {
                        Value::Int(i) => index = Some(i),
                        _ => return None,
                    }
                }
                1 => delta = Some(message(p)?),
                2 => null(p, 4)?,
                _ => finish = string_or_null(p, 4)?,
            }
            Some(())
        })?;
        let (content, reasoning, role) = delta?;
        let index = match index {
            Some(i) => i,
            None => i64::try_from(position).ok()?,
        };
        if !(0..=INDEX_MAX).contains(&index) {
            return None;
        }
        let mut d = ChunkDelta {
            choice: index,
            kind: Kind::Other,
            text: Cow::Borrowed(""),
            reasoning: Cow::Borrowed(""),
            tool_calls: None,
            finish_reason: finish,
            logprobs: None,
            raw: false,
        };
        chat_delta(&mut d, content, reasoning, None, role);
        Some(d)
    }

    /// What a choice's `delta` object (at depth 4, its values at 5) gives:
    /// its content, its reasoning, whether it has a role.
    type Message<'a> = (Option<Cow<'a, str>>, Option<Cow<'a, str>>, bool);

    fn message<'a>(p: &mut Parser<'a>) -> Option<Message<'a>> {
        let (mut content, mut reasoning_content, mut reasoning, mut role) =
            (None, None, None, false);
        // `{}` (a finish reason's chunk) too
        object(p, &DELTA, true, |p, k| {
            match k {
                0 => content = string_or_null(p, 5)?,
                1 => role = string_or_null(p, 5)?.is_some(),
                2 => reasoning_content = string_or_null(p, 5)?,
                3 => reasoning = string_or_null(p, 5)?,
                4 => null(p, 5)?,
                _ => {
                    p.value::<false>(5)?;
                }
            }
            Some(())
        })?;
        Some((content, reasoning_content.or(reasoning), role))
    }
}

/// The value at the cursor (at nesting `depth`) checked: `None` unless it is
/// null (an unbuilt array or object is `Null` too: look at its first byte).
fn null(p: &mut pyjson::Parser<'_>, depth: usize) -> Option<()> {
    let null = p.peek()? == b'n';
    p.value::<false>(depth)?;
    null.then_some(())
}

/// An optional string: `Some(None)` absent or null, `None` another type.
fn opt_str(v: Value<'_>) -> Option<Option<Cow<'_, str>>> {
    match v {
        Value::Null => Some(None),
        Value::Str(s) => Some(Some(s)),
        _ => None,
    }
}

/// The members of a choice the reference reads (absent is `Null`, as the
/// reference treats both alike for all but `index`).
struct Choice<'a> {
    index: Option<Value<'a>>,
    text: Value<'a>,
    finish_reason: Value<'a>,
    logprobs: Value<'a>,
    /// `Some` when `delta` is an object.
    delta: Option<Message<'a>>,
}

/// The members of a chat choice's `delta` the reference reads.
struct Message<'a> {
    content: Value<'a>,
    reasoning_content: Value<'a>,
    reasoning: Value<'a>,
    tool_calls: Value<'a>,
    role: Value<'a>,
}

impl Message<'_> {
    const NONE: Message<'static> = Message {
        content: Value::Null,
        reasoning_content: Value::Null,
        reasoning: Value::Null,
        tool_calls: Value::Null,
        role: Value::Null,
    };
}

/// A chat choice's `delta` (at the cursor, an object) at nesting `depth`.
fn read_message<'a>(p: &mut pyjson::Parser<'a>, depth: usize) -> Option<Message<'a>> {
    let mut m = Message::NONE;
    p.members(depth, |p, key, d| {
        let slot = match key.as_ref() {
            "content" => &mut m.content,
            "reasoning_content" => &mut m.reasoning_content,
            "reasoning" => &mut m.reasoning,
            "tool_calls" => &mut m.tool_calls,
            "role" => &mut m.role,
            _ => return p.value::<false>(d).map(drop),
        };
        *slot = p.value::<true>(d)?;
        Some(())
    })?;
    Some(m)
}

/// The choice at the cursor (the `position`-th of the list, at nesting
/// `depth`) → its delta (`_choice` of the reference).
fn read_choice<'a>(
    p: &mut pyjson::Parser<'a>,
    depth: usize,
    position: usize,
    endpoint: Endpoint,
) -> Option<ChunkDelta<'a>> {
    if p.peek()? != b'{' {
        return None; // not an object
    }
    let mut f = Choice {
        index: None,
        text: Value::Null,
        finish_reason: Value::Null,
        logprobs: Value::Null,
        delta: None,
    };
    p.members(depth, |p, key, d| {
        match (key.as_ref(), endpoint) {
            ("index", _) => f.index = Some(p.value::<true>(d)?),
            ("finish_reason", _) => f.finish_reason = p.value::<true>(d)?,
            ("logprobs", _) => f.logprobs = p.value::<true>(d)?,
            ("text", Endpoint::Completions) => f.text = p.value::<true>(d)?,
            ("delta", Endpoint::Chat) => match p.peek()? {
                b'{' => f.delta = Some(read_message(p, d)?),
                // null is no delta; anything else is not one
                _ => return null(p, d),
            },
            _ => return p.value::<false>(d).map(drop),
        }
        Some(())
    })?;
    let index = match f.index {
        None => i64::try_from(position).ok()?,
        Some(Value::Int(i)) => i,
        Some(_) => return None,
    };
    if !(0..=INDEX_MAX).contains(&index) {
        return None;
    }
    let finish = opt_str(f.finish_reason)?;
    let logprobs = match f.logprobs {
        Value::Null => None,
        lp => {
            if !token_ids_in_range(&lp) {
                return None;
            }
            Some(pyjson::dump(&lp))
        }
    };
    let mut d = ChunkDelta {
        choice: index,
        kind: Kind::Other,
        text: Cow::Borrowed(""),
        reasoning: Cow::Borrowed(""),
        tool_calls: None,
        finish_reason: finish,
        logprobs,
        raw: false,
    };
    match endpoint {
        Endpoint::Completions => {
            let text = opt_str(f.text)?;
            if let Some(t) = text.filter(|t| !t.is_empty()) {
                d.kind = Kind::Content;
                d.text = t;
            } else if d.finish_reason.is_some() {
                d.kind = Kind::Finish;
            } else {
                d.raw = true;
            }
        }
        Endpoint::Chat => {
            let m = f.delta.unwrap_or(Message::NONE);
            let content = opt_str(m.content)?;
            let reasoning = match opt_str(m.reasoning_content)? {
                None => opt_str(m.reasoning)?,
                r => r,
            };
            let tool_calls = match m.tool_calls {
                Value::Null => None,
                v @ Value::Array(_) => {
                    matches!(&v, Value::Array(items) if !items.is_empty()).then(|| pyjson::dump(&v))
                }
                _ => return None,
            };
            chat_delta(
                &mut d,
                content,
                reasoning,
                tool_calls,
                m.role != Value::Null,
            );
        }
    }
    Some(d)
}

/// A chat choice's delta `d` (its index, finish reason and logprobs set)
/// completed from its `delta` object's members as the reference reads them:
/// `content`, the reasoning (`reasoning_content`, else `reasoning`), the
/// `tool_calls` JSON text (a non-empty list), whether `role` is not null.
/// Both readers of a chat choice end here ([`read_choice`], [`fast`]).
fn chat_delta<'a>(
    d: &mut ChunkDelta<'a>,
    content: Option<Cow<'a, str>>,
    reasoning: Option<Cow<'a, str>>,
    tool_calls: Option<String>,
    role: bool,
) {
    d.tool_calls = tool_calls;
    if let Some(c) = content {
        d.text = c;
    }
    if let Some(r) = reasoning {
        d.reasoning = r;
    }
    d.kind = if !d.text.is_empty() {
        Kind::Content
    } else if !d.reasoning.is_empty() {
        Kind::Reasoning
    } else if d.tool_calls.is_some() {
        Kind::ToolCall
    } else if d.finish_reason.is_some() {
        Kind::Finish
    } else if role {
        Kind::Role
    } else {
        d.raw = true;
        Kind::Other
    };
}

/// A token object (`_json._token_object`): `token` (or, absent, `text`) a
/// string and `logprob` a number.
fn token_object(item: &Value<'_>) -> bool {
    if !matches!(item, Value::Object(_)) {
        return false;
    }
    let text = if item.has("token") {
        item.get("token")
    } else {
        item.get("text")
    };
    matches!(text, Some(Value::Str(_)))
        && matches!(item.get("logprob"), Some(Value::Int(_) | Value::Float(_)))
}

/// `check_int(v, TOKEN_ID_RANGE)` would not raise: not a number, or in range.
fn id_ok(v: Option<&Value<'_>>) -> bool {
    match v {
        Some(Value::Int(i)) => (0..=TOKEN_ID_MAX).contains(i),
        #[allow(clippy::cast_precision_loss)] // exact: 2^32 - 1 is a float
        Some(Value::Float(f)) => (0.0..=TOKEN_ID_MAX as f64).contains(f),
        _ => true,
    }
}

fn ids_ok(item: &Value<'_>) -> bool {
    id_ok(item.get("id")) && id_ok(item.get("token_id"))
}

/// `_json.check_token_ids` would not raise for this logprobs value.
fn token_ids_in_range(logprobs: &Value<'_>) -> bool {
    let mut items: Vec<&Value<'_>> = Vec::new();
    match logprobs {
        Value::Object(_) => {
            items.push(logprobs);
            for key in ["content", "refusal"] {
                if let Some(Value::Array(list)) = logprobs.get(key) {
                    items.extend(list.iter());
                }
            }
        }
        Value::Array(list) => items.extend(list.iter()),
        _ => return true,
    }
    items
        .into_iter()
        .filter(|item| token_object(item))
        .all(|item| {
            ids_ok(item)
                && ["top_logprobs", "top_tokens"]
                    .iter()
                    .all(|key| match item.get(key) {
                        Some(Value::Array(alts)) => {
                            alts.iter().filter(|a| token_object(a)).all(ids_ok)
                        }
                        _ => true,
                    })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `extract` as it was: `pyjson::parse`, then a read of the tree (the
    /// reference the one-pass `extract` must equal on every input).
    /// `want_name`: the dialect has not found the reply's model yet.
    pub(super) fn extract_tree(
        data: &str,
        endpoint: Endpoint,
        want_name: bool,
    ) -> Option<Chunk<'_>> {
        let obj = pyjson::parse(data)?;
        let Value::Object(members) = &obj else {
            return None;
        };
        // one pass over the members (no key twice: the parser refuses that)
        let (mut model, mut id, mut choices, mut nested_name) = (None, None, None, false);
        let mut server: [Option<&Value<'_>>; 4] = [None; 4];
        for (k, v) in members {
            match k.as_ref() {
                "choices" => choices = Some(v),
                "model" => model = Some(v),
                "id" => id = Some(v),
                // where JsonDialect._name looks when the top level has no model
                "message" | "response" => nested_name |= matches!(v, Value::Object(_)),
                "object" if v.as_str() == Some("error") => return None,
                "error" if *v != Value::Null => return None,
                "usage" => server[0] = Some(v),
                "timings" => server[1] = Some(v),
                "metrics" => server[2] = Some(v),
                "meta_info" => server[3] = Some(v),
                _ => {}
            }
        }
        let (mut name, mut name_id) = (None, None);
        if want_name {
            match model {
                Some(Value::Str(m)) if !m.is_empty() => {
                    name = Some(m.clone());
                    if let Some(Value::Str(i)) = id {
                        name_id = (!i.is_empty()).then(|| i.clone());
                    }
                }
                _ if nested_name => return None,
                _ => {}
            }
        }
        let choices = match choices {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(items)) => items.as_slice(),
            Some(_) => return None,
        };
        let mut deltas = Vec::with_capacity(choices.len().max(1));
        if choices.is_empty() {
            deltas.push(ChunkDelta {
                choice: STREAM_LEVEL,
                kind: Kind::Other,
                text: Cow::Borrowed(""),
                reasoning: Cow::Borrowed(""),
                tool_calls: None,
                finish_reason: None,
                logprobs: None,
                raw: true,
            });
        }
        for (position, choice) in choices.iter().enumerate() {
            deltas.push(read_choice(choice, position, endpoint)?);
        }
        let server = server
            .iter()
            .any(|v| some(*v).is_some())
            .then(|| Box::new(server.map(|v| v.cloned().unwrap_or(Value::Null))));
        Some(Chunk {
            deltas,
            model: name,
            id: name_id,
            server,
        })
    }

    /// An optional string: `Some(None)` absent or null, `None` another type.
    fn opt_str<'v, 'a>(v: Option<&'v Value<'a>>) -> Option<Option<&'v Cow<'a, str>>> {
        match v {
            None | Some(Value::Null) => Some(None),
            Some(Value::Str(s)) => Some(Some(s)),
            Some(_) => None,
        }
    }

    /// The members of a choice (or of its `delta`) the reference reads.
    #[derive(Default)]
    struct Fields<'v, 'a> {
        index: Option<&'v Value<'a>>,
        delta: Option<&'v Value<'a>>,
        text: Option<&'v Value<'a>>,
        finish_reason: Option<&'v Value<'a>>,
        logprobs: Option<&'v Value<'a>>,
        content: Option<&'v Value<'a>>,
        reasoning_content: Option<&'v Value<'a>>,
        reasoning: Option<&'v Value<'a>>,
        tool_calls: Option<&'v Value<'a>>,
        role: Option<&'v Value<'a>>,
    }

    impl<'v, 'a> Fields<'v, 'a> {
        /// `None` when `obj` is not an object.
        fn of(obj: &'v Value<'a>) -> Option<Self> {
            let Value::Object(members) = obj else {
                return None;
            };
            let mut f = Fields::default();
            for (k, v) in members {
                let slot = match k.as_ref() {
                    "index" => &mut f.index,
                    "delta" => &mut f.delta,
                    "text" => &mut f.text,
                    "finish_reason" => &mut f.finish_reason,
                    "logprobs" => &mut f.logprobs,
                    "content" => &mut f.content,
                    "reasoning_content" => &mut f.reasoning_content,
                    "reasoning" => &mut f.reasoning,
                    "tool_calls" => &mut f.tool_calls,
                    "role" => &mut f.role,
                    _ => continue,
                };
                *slot = Some(v);
            }
            Some(f)
        }
    }

    /// `Some(v)` unless `v` is null.
    fn some<'v, 'a>(v: Option<&'v Value<'a>>) -> Option<&'v Value<'a>> {
        v.filter(|v| **v != Value::Null)
    }

    fn read_choice<'a>(
        choice: &Value<'a>,
        position: usize,
        endpoint: Endpoint,
    ) -> Option<ChunkDelta<'a>> {
        let f = Fields::of(choice)?;
        let index = match f.index {
            None => i64::try_from(position).ok()?,
            Some(Value::Int(i)) => *i,
            Some(_) => return None,
        };
        if !(0..=INDEX_MAX).contains(&index) {
            return None;
        }
        let finish = opt_str(f.finish_reason)?.cloned();
        let logprobs = match some(f.logprobs) {
            None => None,
            Some(lp) => {
                if !token_ids_in_range(lp) {
                    return None;
                }
                Some(pyjson::dump(lp))
            }
        };
        let mut d = ChunkDelta {
            choice: index,
            kind: Kind::Other,
            text: Cow::Borrowed(""),
            reasoning: Cow::Borrowed(""),
            tool_calls: None,
            finish_reason: finish,
            logprobs,
            raw: false,
        };
        match endpoint {
            Endpoint::Completions => {
                let text = opt_str(f.text)?;
                if let Some(t) = text.filter(|t| !t.is_empty()) {
                    d.kind = Kind::Content;
                    d.text = t.clone();
                } else if d.finish_reason.is_some() {
                    d.kind = Kind::Finish;
                } else {
                    d.raw = true;
                }
            }
            Endpoint::Chat => {
                let m = match some(f.delta) {
                    None => Fields::default(),
                    Some(msg) => Fields::of(msg)?,
                };
                let content = opt_str(m.content)?;
                let reasoning = match opt_str(m.reasoning_content)? {
                    None => opt_str(m.reasoning)?,
                    r => r,
                };
                d.tool_calls = match some(m.tool_calls) {
                    None => None,
                    Some(v @ Value::Array(items)) => (!items.is_empty()).then(|| pyjson::dump(v)),
                    Some(_) => return None,
                };
                if let Some(c) = content {
                    d.text = c.clone();
                }
                if let Some(r) = reasoning {
                    d.reasoning = r.clone();
                }
                d.kind = if !d.text.is_empty() {
                    Kind::Content
                } else if !d.reasoning.is_empty() {
                    Kind::Reasoning
                } else if d.tool_calls.is_some() {
                    Kind::ToolCall
                } else if d.finish_reason.is_some() {
                    Kind::Finish
                } else if some(m.role).is_some() {
                    Kind::Role
                } else {
                    d.raw = true;
                    Kind::Other
                };
            }
        }
        Some(d)
    }

    fn one(data: &str, e: Endpoint) -> Option<ChunkDelta<'_>> {
        let mut c = extract(data, e, false)?;
        assert_eq!(c.deltas.len(), 1);
        c.deltas.pop()
    }

    #[test]
    fn chat_kinds() {
        let d = one(
            r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!((d.choice, d.kind, &*d.text), (0, Kind::Content, "hi"));
        let d = one(
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!(d.kind, Kind::Role);
        let d = one(r#"{"choices":[{"delta":{"content":""}}]}"#, Endpoint::Chat).unwrap();
        assert_eq!((d.kind, d.raw), (Kind::Other, true));
        let d = one(
            r#"{"choices":[{"delta":{"reasoning":"r"}}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!((d.kind, &*d.reasoning), (Kind::Reasoning, "r"));
        let d = one(
            r#"{"choices":[{"delta":{"tool_calls":[{"a": 1.5e-7}]}}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!(
            (d.kind, d.tool_calls.as_deref()),
            (Kind::ToolCall, Some(r#"[{"a":1.5e-07}]"#))
        );
        let d = one(
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!(
            (d.kind, d.finish_reason.as_deref()),
            (Kind::Finish, Some("stop"))
        );
        let d = one(r#"{"choices":[]}"#, Endpoint::Chat).unwrap();
        assert_eq!((d.choice, d.kind, d.raw), (STREAM_LEVEL, Kind::Other, true));
    }

    #[test]
    fn completions_kinds() {
        let d = one(
            r#"{"choices":[{"index":3,"text":"x","logprobs":null}]}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!((d.choice, d.kind, &*d.text), (3, Kind::Content, "x"));
        let d = one(
            r#"{"choices":[{"text":"","finish_reason":"length"}]}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!(d.kind, Kind::Finish);
    }

    #[test]
    fn not_mine() {
        for data in [
            r#"{"choices":[{"index":-1,"delta":{}}]}"#,
            r#"{"choices":[{"index":2147483648,"delta":{}}]}"#,
            r#"{"choices":[{"index":true,"delta":{}}]}"#,
            r#"{"choices":[{"index":null,"delta":{}}]}"#,
            r#"{"choices":[{"delta":{"content":1}}]}"#,
            r#"{"choices":[{"delta":[]}]}"#,
            r#"{"choices":{}}"#,
            r#"{"choices":[1]}"#,
            r#"{"error":{"message":"x"}}"#,
            r#"{"object":"error","message":"x"}"#,
            r#"{"choices":[{"delta":{},"logprobs":{"content":[{"token":"a","logprob":-1,"id":4294967296}]}}]}"#,
            r#"{"choices":[{"delta":{},"logprobs":[{"text":"a","logprob":-1,"top_tokens":[{"text":"b","logprob":0,"id":-1}]}]}]}"#,
            "[]",
        ] {
            assert_eq!(extract(data, Endpoint::Chat, false), None, "{data}");
        }
        // a token id out of range outside a token object is not checked
        assert!(extract(
            r#"{"choices":[{"delta":{},"logprobs":{"content":[{"token":"a","id":-5}]}}]}"#,
            Endpoint::Chat,
            false
        )
        .is_some());
    }

    #[test]
    fn usage_and_server_statistics_are_handed_back() {
        let c = extract(
            r#"{"choices":[],"usage":{"prompt_tokens":1},"timings":null,"meta_info":{"spec_verify_ct":2}}"#,
            Endpoint::Chat,
            false,
        )
        .unwrap();
        let server = c.server.unwrap();
        assert_eq!(server[0].get("prompt_tokens"), Some(&Value::Int(1)));
        assert_eq!((&server[1], &server[2]), (&Value::Null, &Value::Null));
        assert_eq!(server[3].get("spec_verify_ct"), Some(&Value::Int(2)));
        let c = extract(r#"{"choices":[],"usage":null}"#, Endpoint::Chat, false).unwrap();
        assert_eq!(c.server, None);
    }

    #[test]
    fn the_name() {
        let c = extract(
            r#"{"id":"x","model":"m","choices":[]}"#,
            Endpoint::Chat,
            true,
        )
        .unwrap();
        assert_eq!(
            (c.model.as_deref(), c.id.as_deref()),
            (Some("m"), Some("x"))
        );
        let c = extract(
            r#"{"id":"x","model":"","choices":[]}"#,
            Endpoint::Chat,
            true,
        )
        .unwrap();
        assert_eq!((c.model, c.id), (None, None));
        assert_eq!(
            extract(
                r#"{"message":{"model":"m"},"choices":[]}"#,
                Endpoint::Chat,
                true
            ),
            None
        );
        assert!(extract(
            r#"{"message":{"model":"m"},"choices":[]}"#,
            Endpoint::Chat,
            false
        )
        .is_some());
    }
}

/// The one-pass `extract` against `extract_tree` (a parse, then a read of the
/// tree: the code it replaced) on generated chunks, valid and broken.
#[cfg(test)]
mod same_as_tree {
    use super::tests::extract_tree;
    use super::*;
    use proptest::prelude::*;

    const KEYS: &[&str] = &[
        "choices",
        "delta",
        "content",
        "index",
        "id",
        "model",
        "usage",
        "timings",
        "metrics",
        "meta_info",
        "object",
        "error",
        "message",
        "response",
        "logprobs",
        "tool_calls",
        "role",
        "text",
        "finish_reason",
        "reasoning",
        "reasoning_content",
        "token",
        "logprob",
        "top_logprobs",
        "top_tokens",
        "token_id",
        "refusal",
        "x",
        "\\u0069d",
        "\\u0063hoices",
    ];
    const LEAVES: &[&str] = &[
        "null",
        "true",
        "false",
        "0",
        "-1",
        "3",
        "1.5",
        "-2.5e-7",
        "1e400",
        "-0",
        "01",
        "1.",
        "2147483648",
        "4294967295",
        "4294967296",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775809",
        "12345678901234567890",
        "\"\"",
        "\"hi\"",
        "\"stop\"",
        "\"error\"",
        "\"assistant\"",
        "\"\\u00e9\\n\\/\"",
        "\"\\ud800\"",
        "\"\\udc00x\"",
        "\"\\ud83d\\ude00\"",
        "\"a\\u0001\"",
        "\"a\u{1}\"",
        "\"\\x\"",
        "\"é😀\"",
        "NaN",
        "tru",
    ];

    fn value() -> impl Strategy<Value = String> {
        let leaf = proptest::sample::select(LEAVES).prop_map(str::to_owned);
        leaf.prop_recursive(5, 48, 5, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                proptest::collection::vec(
                    (proptest::sample::select(KEYS), inner, " ?", " ?"),
                    0..6
                )
                .prop_map(|members| {
                    let body: Vec<String> = members
                        .into_iter()
                        .map(|(k, v, a, b)| format!("{a}\"{k}\"{b}:{a}{v}"))
                        .collect();
                    format!("{{{}}}", body.join(","))
                }),
            ]
        })
    }

    /// A chunk-shaped object (a choice list mostly) or any value, then maybe
    /// one byte cut or inserted.
    fn doc() -> impl Strategy<Value = String> {
        let chunk = (value(), value(), value(), value()).prop_map(|(a, b, c, d)| {
            format!(
                r#"{{"id":"c","object":"chat.completion.chunk","model":{a},"choices":[{{"index":0,"delta":{b},"logprobs":{c},"finish_reason":null}}],"usage":{d}}}"#
            )
        });
        let doc = prop_oneof![chunk, value()];
        (
            doc,
            any::<usize>(),
            0..4_u8,
            proptest::sample::select(b"{}[],:\"\\ 0e-".as_slice()),
        )
            .prop_map(|(d, at, how, byte)| {
                let mut b = d.into_bytes();
                let at = at.checked_rem(b.len().saturating_add(1)).unwrap_or(0);
                match how {
                    0 if at < b.len() => {
                        b.remove(at);
                    }
                    1 => b.insert(at, byte),
                    _ => {}
                }
                String::from_utf8(b).unwrap_or_default()
            })
    }

    fn same(d: &str) {
        for e in [Endpoint::Chat, Endpoint::Completions] {
            for want in [false, true] {
                assert_eq!(
                    extract(d, e, want),
                    extract_tree(d, e, want),
                    "{d} {e:?} {want}"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn one_pass_is_the_tree(d in doc()) {
            same(&d);
        }
    }

    #[test]
    fn hostile_members_nobody_reads() {
        let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
        let wide = |n: usize| {
            let keys: Vec<String> = (0..n).map(|i| format!("\"k{i}\":0")).collect();
            format!("{{{}}}", keys.join(","))
        };
        for (skipped, ok) in [
            (deep(63), true), // the member is at depth 2: 63 more levels fit
            (deep(64), false),
            (wide(256), true),
            (wide(257), false),
            (r#"{"a":1,"a":2}"#.into(), false),
            (r#"{"a":1,"\u0061":2}"#.into(), false),
            (r#"{"a":{"b":1},"b":{"a":1}}"#.into(), true),
            (r#"[{"a":1},{"a":1}]"#.into(), true),
            ("1e400".into(), false),
            ("-0".into(), false),
            ("9223372036854775808".into(), false),
            (r#""\ud800""#.into(), false),
            (r#""\u12""#.into(), false),
            ("\"\u{1f}\"".into(), false),
        ] {
            for at in ["system_fingerprint", "message"] {
                let d =
                    format!(r#"{{"{at}":{skipped},"choices":[{{"delta":{{"content":"x"}}}}]}}"#);
                same(&d);
                assert_eq!(extract(&d, Endpoint::Chat, false).is_some(), ok, "{d}");
                let d = format!(
                    r#"{{"choices":[{{"delta":{{"content":"x","{at}":{skipped}}},"{at}":1}}]}}"#
                );
                same(&d);
                if !skipped.starts_with("[[") {
                    assert_eq!(extract(&d, Endpoint::Chat, false).is_some(), ok, "{d}");
                }
            }
        }
        // in a delta, an unread member is at depth 5: 60 more levels fit
        for (n, ok) in [(60, true), (61, false)] {
            let d = format!(r#"{{"choices":[{{"delta":{{"x":{}}}}}]}}"#, deep(n));
            same(&d);
            assert_eq!(extract(&d, Endpoint::Chat, false).is_some(), ok, "{d}");
        }
        // a duplicate key among the top level's read and unread members
        same(r#"{"id":"a","choices":[],"id":"b"}"#);
        assert_eq!(
            extract(r#"{"choices":[],"x":1,"x":1}"#, Endpoint::Chat, false),
            None
        );
        assert_eq!(
            extract(
                r#"{"choices":[{"delta":{},"q":[],"q":[]}]}"#,
                Endpoint::Chat,
                false
            ),
            None
        );
    }
}

/// The fast path ([`fast`]) against the general reading: whenever it takes
/// an item, it gives what `general` gives, on the common shapes (which it
/// must take) and on odd ones (escapes, non-ASCII text, members missing,
/// reordered, repeated, of other types, whitespace, cut or spliced bytes).
#[cfg(test)]
mod fast_is_general {
    use super::*;
    use proptest::prelude::*;

    /// Whether the fast path took `d`; when it did, for either `want_name`,
    /// its chunk is the general reading's.
    fn check(d: &str) -> bool {
        let mut took = false;
        for want in [false, true] {
            if let Some(got) = fast::chat(d, want) {
                took = true;
                assert_eq!(
                    Some(got),
                    general(d, Endpoint::Chat, want),
                    "{d} want_name={want}"
                );
            }
            // and `extract` is the general reading, whoever read it
            assert_eq!(
                extract(d, Endpoint::Chat, want),
                general(d, Endpoint::Chat, want),
                "{d}"
            );
        }
        took
    }

    #[test]
    fn common_shapes_are_taken() {
        for d in [
            r#"{"id":"b","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"w0.0 "},"finish_reason":null}]}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","service_tier":"default","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}],"obfuscation":"xyz"}"#,
            r#"{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"delta":{"content":"a\nb\t\"q\" \u00e9 \ud83d\ude00 é😀"},"index":0}],"model":"m","id":"x"}"#,
            r#"{"id":"c","model":"","choices":[{"index":1,"delta":{"reasoning_content":"think"},"finish_reason":null},{"index":0,"delta":{"reasoning":"r","content":null}}]}"#,
            r#" { "id" : "c" , "choices" : [ { "index" : 0 , "delta" : { "content" : "x" , "tool_calls" : null } } ] } "#,
            r#"{"id":"c","choices":[{"delta":{"role":"assistant"}}]}"#,
            r#"{"id":"c","choices":[{"delta":{"content":""},"finish_reason":"length"}]}"#,
            r#"{"id":"c","choices":[{"delta":{"refusal":[1,{"a":null}]}}]}"#,
        ] {
            assert!(check(d), "not taken: {d}");
            assert!(general(d, Endpoint::Chat, true).is_some(), "{d}");
        }
    }

    #[test]
    fn odd_items_are_left_or_read_alike() {
        for d in [
            // repeated members, at each level (the general reading refuses them)
            r#"{"id":"a","id":"b","choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"delta":{"content":"x"}}],"choices":[{"delta":{"content":"y"}}]}"#,
            r#"{"choices":[{"index":0,"index":1,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"delta":{"content":"x","content":"y"}}]}"#,
            r#"{"choices":[{"delta":{"content":"x"},"delta":{}}]}"#,
            // a key written with an escape (the same key, decoded)
            r#"{"\u0069d":"a","id":"b","choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"delta":{"\u0063ontent":"x"}}]}"#,
            // members missing, or of another type
            r#"{"id":"a"}"#,
            r#"{"choices":[]}"#,
            r#"{"choices":null}"#,
            r#"{"choices":[{}]}"#,
            r#"{"choices":[{"index":0}]}"#,
            r#"{"choices":[{"delta":null}]}"#,
            r#"{"choices":[{"delta":{"content":5}}]}"#,
            r#"{"choices":[{"delta":{"role":null,"content":null}}]}"#,
            r#"{"choices":[{"delta":{"role":7}}]}"#,
            r#"{"choices":[{"index":"0","delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"index":0.0,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"index":-1,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"index":-0,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"index":01,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"index":2147483648,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"index":2147483647,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"index":99999999999999999999,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"delta":{"content":"x"},"finish_reason":1}]}"#,
            r#"{"choices":[{"delta":{"content":"x"},"logprobs":{"content":[]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#,
            r#"{"model":null,"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"model":5,"id":"i","choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"id":null,"model":"m","choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"object":"error","choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"error":null,"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"usage":{"total_tokens":3},"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"usage":nul,"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"message":{"model":"m"},"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"created":1e400,"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"created":-0,"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"created":[[[]]],"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"delta":{"content":"x"},"text":"t"}]}"#,
            // strings the subset refuses, and broken syntax
            r#"{"choices":[{"delta":{"content":"\ud800"}}]}"#,
            r#"{"choices":[{"delta":{"content":"\x"}}]}"#,
            "{\"choices\":[{\"delta\":{\"content\":\"a\u{1}\"}}]}",
            r#"{"choices":[{"delta":{"content":"x"}}]}x"#,
            r#"{"choices":[{"delta":{"content":"x"}}],}"#,
            r#"{"choices":[{"delta":{"content":"x"},}]}"#,
            r#"{"choices":[{"delta":{"content":"x"}},]}"#,
            r#"{"choices":[{"delta":{"content":"x"}}]"#,
            r#"{"choices":[{"delta":{"content":"x"}}]}}"#,
            r#"{"choices" [{"delta":{"content":"x"}}]}"#,
            "\u{feff}{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}",
            "{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\u{a0}",
            "",
            "[DONE]",
            "{",
            "{}",
            "null",
        ] {
            check(d);
        }
        // taken where the general reading takes it the same way
        assert!(check(
            r#"{"choices":[{"index":2147483647,"delta":{"content":"x"}}]}"#
        ));
        assert!(check(
            r#"{"choices":[{"delta":{"role":null,"content":null}}]}"#
        ));
    }

    /// A member of an object: mostly a key and a value the fast path knows
    /// there (`keys`, `values`), else an odd one (another key, one escaped,
    /// a value of another type or one the subset refuses).
    fn member(
        keys: &'static [&'static str],
        values: &'static [&'static str],
    ) -> impl Strategy<Value = String> {
        const ODD_KEYS: &[&str] = &["x", "error", "message", "text", "\\u0069d", "\\u0063ontent"];
        const ODD: &[&str] = &[
            "null",
            "0",
            "7",
            "-0",
            "01",
            "1.5",
            "1e400",
            "2147483648",
            "true",
            "[]",
            "{}",
            "[1,{\"a\":null}]",
            "{\"a\":1,\"a\":1}",
            "\"\\ud800\"",
            "\"a\\u0001\"",
            "\"a\u{1}\"",
            "\"\\x\"",
            "\"error\"",
            "nul",
        ];
        let key = prop_oneof![
            24 => proptest::sample::select(keys),
            1 => proptest::sample::select(ODD_KEYS),
        ];
        let value = prop_oneof![
            16 => proptest::sample::select(values),
            1 => proptest::sample::select(ODD),
        ];
        (key, value, " ?", " ?").prop_map(|(k, v, a, b)| format!("{a}\"{k}\"{b}:{a}{v}{b}"))
    }

    /// Strings of all kinds (escapes, non-ASCII text) and null.
    const STRINGS: &[&str] = &[
        "\"\"",
        "\"x\"",
        "\"stop\"",
        "\"assistant\"",
        "\"a\\nb\"",
        "\"\\\"q\\\\\"",
        "\"\\u00e9\\/\"",
        "\"\\ud83d\\ude00\"",
        "\"é😀\"",
        "null",
    ];

    fn delta() -> impl Strategy<Value = String> {
        const KEYS: &[&str] = &[
            "content",
            "content",
            "content",
            "role",
            "reasoning_content",
            "reasoning",
            "tool_calls",
            "refusal",
        ];
        proptest::collection::vec(member(KEYS, STRINGS), 0..4)
            .prop_map(|m| format!("{{{}}}", m.join(",")))
    }

    fn choice() -> impl Strategy<Value = String> {
        const KEYS: &[&str] = &["index", "finish_reason", "logprobs"];
        const VALUES: &[&str] = &[
            "0",
            "1",
            "3",
            "2147483647",
            "null",
            "\"stop\"",
            "\"\\u0073top\"",
        ];
        (
            proptest::collection::vec(member(KEYS, VALUES), 0..3),
            delta(),
            proptest::bool::weighted(0.9),
            0..3_usize,
        )
            .prop_map(|(mut m, d, with, at)| {
                if with {
                    let at = at.min(m.len());
                    m.insert(at, format!("\"delta\":{d}"));
                }
                format!("{{{}}}", m.join(","))
            })
    }

    fn chunk() -> impl Strategy<Value = String> {
        const KEYS: &[&str] = &[
            "id",
            "object",
            "model",
            "usage",
            "created",
            "system_fingerprint",
            "service_tier",
            "obfuscation",
        ];
        const VALUES: &[&str] = &[
            "\"c\"",
            "\"chat.completion.chunk\"",
            "\"gpt-4o\"",
            "\"\"",
            "\"m\\u00e9\"",
            "\"chatcmpl-\\\"1\\\"\"",
            "null",
            "1700000000",
        ];
        (
            proptest::collection::vec(member(KEYS, VALUES), 0..4),
            prop_oneof![
                1 => proptest::collection::vec(choice(), 0..1),
                8 => proptest::collection::vec(choice(), 1..3),
            ],
            0..4_usize,
            0..5_u8,
        )
            .prop_map(|(mut m, cs, at, how)| {
                let at = at.min(m.len());
                match how {
                    0 | 1 => m.insert(at, format!("\"choices\":[{}]", cs.join(","))),
                    2 => m.insert(at, format!("\"choices\" : [ {} ] ", cs.join(" , "))),
                    3 => m.insert(at, "\"choices\":null".into()),
                    _ => {}
                }
                format!("{{{}}}", m.join(","))
            })
    }

    /// A chunk, then maybe one byte cut or inserted.
    fn doc() -> impl Strategy<Value = String> {
        (
            chunk(),
            any::<usize>(),
            0..8_u8,
            proptest::sample::select(b"{}[],:\"\\ 0en-".as_slice()),
        )
            .prop_map(|(d, at, how, byte)| {
                let mut b = d.into_bytes();
                let at = at.checked_rem(b.len().saturating_add(1)).unwrap_or(0);
                match how {
                    0 if at < b.len() => {
                        b.remove(at);
                    }
                    1 => b.insert(at, byte),
                    _ => {}
                }
                String::from_utf8(b).unwrap_or_default()
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(50000))]
        #[test]
        fn fast_gives_what_general_gives(d in doc()) {
            check(&d);
        }
    }
}
