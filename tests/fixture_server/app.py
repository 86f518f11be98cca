"""A deterministic, OpenAI-compatible streaming server for tests, benchmarks and pcaps.

Raw ASGI (no framework), served by uvicorn on loopback. The output text is a pure
function of (model, prompt/messages, max_tokens, n, seed): words are picked from
built-in lists by hashing those inputs, so two identical requests get byte-identical
responses (``created`` and ``id`` are derived from the same hash, not a clock).

Behaviour is set by server options (:class:`Options`, from the CLI or environment)
and can be overridden per request through the model name: ``fake-<token>-<token>…``
where a token is a flavour (``english``, ``cjk``, ``emoji``, ``code``, ``mixed``), a
style (``openai``, ``transformers``, ``llamacpp``), ``reasoning``, ``tools``,
``fffd``, ``ignoreeos``, or ``tpcK`` / ``delayD`` / ``perturbP`` / ``failP`` /
``draftK`` / ``acceptP`` with an integer. Example: model ``fake-cjk-fffd-tpc2``.

``draftK`` makes the server report speculative decoding with K drafted tokens
per verification step, accepting ``acceptP`` percent of them (default 70; see
:func:`spec_steps`), the way real servers report it on the last chunks of a
stream. The wire shapes are crafted to the documented formats, not recorded
from those servers: on the last chunk of the stream (the usage chunk with
``include_usage``, else the last finish chunk) the ``llamacpp`` style puts
llama-server's ``timings`` (with ``draft_n`` / ``draft_n_accepted``), the
``openai`` style vLLM's ``metrics.speculative_decoding``
(``--per-request-spec-decode-metrics``); the ``transformers`` style reports
nothing. A non-streamed body carries them at its top level. The stream shows
the steps too (one choice without reasoning or tools): the ``openai`` style
sends each step's tokens as one chunk, the ``llamacpp`` style one token per
event but waits ``delayD`` only before each step's first token (the cadence
``sniffer.llm.cadence`` reads).

Vocabulary used below: a *piece* is one unit of generated text (a word, a CJK word,
an emoji, a code token); a *token* is one unit the server streams, normally one
piece, but in U+FFFD mode or the llama.cpp style a piece may become two tokens. A
chunk carries ``tokens_per_chunk`` tokens. ``max_tokens`` counts tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field, replace
from itertools import accumulate, islice, pairwise
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

FLAVOURS = ("english", "cjk", "emoji", "code", "mixed")
STYLES = ("openai", "transformers", "llamacpp")
MODELS = (
    "fake",
    "fake-cjk",
    "fake-emoji",
    "fake-code",
    "fake-mixed",
    "fake-transformers",
    "fake-llamacpp",
    "fake-reasoning",
    "fake-tools",
    "fake-fffd",
)
MAX_BODY = 1 << 20  # request bodies above this get 413
TOO_LARGE = b"\x00too-large"  # sentinel returned by _read_body (compared by identity)
MAX_TOKENS_CAP = 100_000  # a request cannot ask for more tokens than this
MAX_DRAFT = 16  # drafted tokens per verification step, at most


@dataclass(frozen=True)
class Options:
    """Server behaviour. Every field can be overridden per request by the model name."""

    flavour: str = "english"
    style: str = "openai"
    tokens_per_chunk: int = 1
    delay_ms: float = 0.0
    perturb_after: int | None = None  # pieces [0, P) as by default, different from P on
    reasoning: bool = False
    tool_calls: bool = False
    fail_after: int | None = None  # error object after this many output chunks
    fffd: bool = False  # some multi-byte pieces are sent split, as U+FFFD deltas
    ignore_eos: bool = False  # always generate max_tokens tokens (finish "length")
    draft: int | None = None  # speculative decoding: drafted tokens per verification step
    accept_pct: int = 70  # ... of which this percentage is accepted (spec_steps)

    def __post_init__(self) -> None:
        if self.flavour not in FLAVOURS:
            raise ValueError(f"unknown flavour {self.flavour!r}; one of {FLAVOURS}")
        if self.style not in STYLES:
            raise ValueError(f"unknown style {self.style!r}; one of {STYLES}")
        if self.tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be >= 1")
        if self.draft is not None and not 1 <= self.draft <= MAX_DRAFT:
            raise ValueError(f"draft must be in 1..{MAX_DRAFT}")
        if not 0 <= self.accept_pct <= 100:
            raise ValueError("accept_pct must be in 0..100")


_NUM_TOKEN = re.compile(r"^(tpc|delay|perturb|fail|draft|accept)(\d+)$")


def options_for_model(model: str, base: Options) -> tuple[Options, str]:
    """Per-request options from the model name, and the model key used for hashing.

    The key keeps only the tokens that are not behaviour switches, so that a
    ``perturb``/``delay``/style variant of a model produces the same words.
    """
    parts = model.split("-")
    if parts[0] != "fake":
        return base, model
    opts = base
    kept: list[str] = []
    for tok in parts[1:]:
        m = _NUM_TOKEN.match(tok)
        if tok in FLAVOURS:
            opts = replace(opts, flavour=tok)
            kept.append(tok)
        elif tok in STYLES:
            opts = replace(opts, style=tok)
        elif tok == "reasoning":
            opts = replace(opts, reasoning=True)
        elif tok == "tools":
            opts = replace(opts, tool_calls=True)
        elif tok == "fffd":
            opts = replace(opts, fffd=True)
        elif tok == "ignoreeos":
            opts = replace(opts, ignore_eos=True)
        elif m:
            num = int(m.group(2))
            name = m.group(1)
            if name == "tpc":
                opts = replace(opts, tokens_per_chunk=max(1, num))
            elif name == "delay":
                opts = replace(opts, delay_ms=float(num))
            elif name == "perturb":
                opts = replace(opts, perturb_after=num)
            elif name == "draft":
                opts = replace(opts, draft=min(max(1, num), MAX_DRAFT))
            elif name == "accept":
                opts = replace(opts, accept_pct=min(num, 100))
            else:
                opts = replace(opts, fail_after=num)
        else:
            kept.append(tok)
    return opts, "-".join(["fake", *kept])


# ---------------------------------------------------------------------------
# Deterministic text
# ---------------------------------------------------------------------------


def _h(*parts: object) -> int:
    data = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _split_words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


WORDS = _split_words(
    "the quick brown fox jumps over lazy dog while river stones glitter under "
    "morning light and every small bird sings about distant mountains where old "
    "trees hold quiet stories of rain wind snow summer harvest bread cheese apple "
    "window garden letter music table candle forest ocean signal packet server "
    "token stream model answer question simple careful bright gentle heavy "
    "ancient modern silver golden purple green yellow seven eleven hundred "
    "because although however therefore perhaps indeed really quickly slowly"
)

CJK_WORDS = _split_words(
    "我们 今天 天气 很好 可以 学习 中文 数据 模型 生成 文本 测试 服务器 流式 输出 一个 "
    "这个 问题 回答 因为 所以 但是 非常 重要 时间 世界 朋友 电脑 网络 字符 编码 令牌 "
    "猫 狗 山 水 人 大 小 的 了 是 在 和 龍 體 綠"
)

EMOJI = (
    "😀",
    "👍🏽",
    "👨\u200d👩\u200d👧\u200d👦",
    "🇯🇵",
    "❤️",
    "🏳️\u200d🌈",
    "🧑\u200d💻",
    "👩🏾\u200d🚀",
    "🎉",
    "🙂",
    "🐍",
    "✨",
    "🔥",
    "🚀",
    "🇫🇷",
    "😂",
)

CODE_SNIPPETS = (
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    'def greet(name: str) -> str:\n    """Say hello."""\n    return f"hello {name}"\n',
    "while total < limit:\n    total += step\n",
    "try:\n    value = int(text)\nexcept ValueError:\n    value = 0\n",
    "items = [x * x for x in data if x > 0]\n",
    "with open(path) as fh:\n    lines = fh.read().splitlines()\n",
    "if __name__ == '__main__':\n    main()\n",
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "counts = {}\nfor word in words:\n\tcounts[word] = counts.get(word, 0) + 1\n",
    "async def fetch(url):\n    async with session.get(url) as resp:\n"
    "        return await resp.text()\n",
)

_CODE_TOKEN = re.compile(r"\n|[ ]*\w+|[ ]*[^\w\s]|\s")
_CODE_PIECES = tuple(tuple(_CODE_TOKEN.findall(s)) for s in CODE_SNIPPETS)
assert all("".join(p) == s for p, s in zip(_CODE_PIECES, CODE_SNIPPETS, strict=True))


def _english(key: str, start: int) -> Iterator[str]:
    i = start
    while True:
        sentence_start = i == 0 or _h(key, "p", i - 1) % 8 == 0
        word = WORDS[_h(key, "w", i) % len(WORDS)]
        if sentence_start:
            word = word.capitalize()
        p = _h(key, "p", i) % 8
        punct = "." if p == 0 else "," if p == 1 else ""
        yield ("" if i == 0 else " ") + word + punct
        i += 1


def _cjk(key: str, start: int) -> Iterator[str]:
    i = start
    while True:
        p = _h(key, "p", i) % 9
        if i > 0 and p == 0:
            yield "。"
        elif i > 0 and p == 1:
            yield "，"
        else:
            yield CJK_WORDS[_h(key, "w", i) % len(CJK_WORDS)]
        i += 1


def _emoji(key: str, start: int) -> Iterator[str]:
    i = start
    while True:
        r = _h(key, "w", i)
        if r % 3 == 0:
            yield ("" if i == 0 else " ") + WORDS[(r // 3) % len(WORDS)]
        else:
            yield EMOJI[(r // 3) % len(EMOJI)]
        i += 1


def _code(key: str, start: int) -> Iterator[str]:
    del start  # code is generated snippet by snippet
    j = 0
    while True:
        yield from _CODE_PIECES[_h(key, "s", j) % len(_CODE_PIECES)]
        yield "\n"
        j += 1


def _mixed(key: str, start: int) -> Iterator[str]:
    j = 0
    while True:
        r = _h(key, "seg", j)
        flavour = ("english", "cjk", "emoji", "code")[r % 4]
        length = 3 + (r // 4) % 6
        yield from islice(_GENERATORS[flavour](f"{key}|{flavour}|{j}", start or 1), length)
        j += 1
        start = 1


_GENERATORS: dict[str, Callable[[str, int], Iterator[str]]] = {
    "english": _english,
    "cjk": _cjk,
    "emoji": _emoji,
    "code": _code,
    "mixed": _mixed,
}


def generate_pieces(
    flavour: str, key: str, count: int, perturb_after: int | None = None
) -> list[str]:
    """``count`` pieces of text for ``key``.

    With ``perturb_after=P`` (P < count) pieces [0, P) are those of the
    unperturbed output and piece P is guaranteed to differ from it.
    """
    gen = _GENERATORS[flavour]
    base = list(islice(gen(key, 0), count))
    if perturb_after is None or perturb_after >= count:
        return base
    p = max(0, perturb_after)
    other = gen(key + "#perturbed", p)
    first = next(other)
    for _ in range(64):
        if first != base[p]:
            break
        first = next(other)
    if first == base[p]:  # pragma: no cover - 64 identical draws in a row
        first += "~"
    return [*base[:p], first, *islice(other, count - p - 1)]


def _split_multibyte(piece: str) -> tuple[str, str] | None:
    """Split a piece inside its first multi-byte character, decoding each half
    on its own (what a per-token detokenizer does): both halves get U+FFFD."""
    raw = piece.encode()
    for off, ch in enumerate(piece):
        if ord(ch) >= 0x80:
            at = len(piece[:off].encode()) + 1
            return (
                raw[:at].decode("utf-8", "replace"),
                raw[at:].decode("utf-8", "replace"),
            )
    return None


def pieces_to_tokens(pieces: list[str], key: str, style: str, fffd: bool) -> list[str]:
    """Pieces → streamed tokens.

    - U+FFFD mode (not llama.cpp): every third multi-byte piece (by hash) is sent
      as two tokens split inside its first character, decoded separately.
    - llama.cpp style: about one piece in five is preceded by an empty token
      (llama-cpp-python holds back incomplete characters and sends ``""``).
    """
    out: list[str] = []
    for j, piece in enumerate(pieces):
        r = _h(key, "tok", j)
        if style == "llamacpp":
            if r % 5 == 0:
                out.append("")
            out.append(piece)
            continue
        split = _split_multibyte(piece) if fffd and r % 3 == 0 else None
        if split is None:
            out.append(piece)
        else:
            out.extend(split)
    return out


# ---------------------------------------------------------------------------
# Request → plan of what to send
# ---------------------------------------------------------------------------


@dataclass
class ChoicePlan:
    index: int
    reasoning: list[str]
    content: list[str]
    tool_name: str | None
    tool_id: str | None
    tool_args: list[str]
    finish_reason: str

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def tokens(self) -> int:
        return len(self.reasoning) + len(self.content) + len(self.tool_args)


@dataclass
class Plan:
    chat: bool
    model: str
    stream: bool
    include_usage: bool
    opts: Options
    ident: str
    created: int
    prompt_tokens: int
    choices: list[ChoicePlan] = field(default_factory=list)

    def usage(self) -> dict[str, int]:
        completion = sum(c.tokens for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def spec(self) -> list[int] | None:
        """Accepted drafts per verification step (:func:`spec_steps`) when the
        server speculates (``draftK``) and reports it (not the transformers style)."""
        if self.opts.draft is None or self.opts.style == "transformers":
            return None
        tokens = self.usage()["completion_tokens"]
        return spec_steps(tokens, self.opts.draft, self.opts.accept_pct) if tokens else None

    def llamacpp_timings(self, steps: list[int]) -> dict[str, Any]:
        """llama.cpp's ``timings`` object, with ``draft_n`` / ``draft_n_accepted``
        (made-up but consistent times: 1.25 ms per prompt token, 20 ms per step)."""
        k = self.opts.draft or 0
        predicted = self.usage()["completion_tokens"]
        prompt_ms = 1.25 * self.prompt_tokens
        predicted_ms = 20.0 * len(steps)
        return {
            "prompt_n": self.prompt_tokens,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / max(1, self.prompt_tokens),
            "prompt_per_second": 1000.0 * self.prompt_tokens / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / max(1, predicted),
            "predicted_per_second": 1000.0 * predicted / predicted_ms if predicted_ms else 0.0,
            "draft_n": k * len(steps),
            "draft_n_accepted": sum(steps),
        }

    def vllm_metrics(self, steps: list[int]) -> dict[str, Any]:
        """vLLM's per-request ``metrics`` object with ``speculative_decoding``."""
        k = self.opts.draft or 0
        histogram = [0] * (k + 1)
        for a in steps:
            histogram[a] += 1
        accepted = sum(steps)
        return {
            "speculative_decoding": {
                "mean_acceptance_length": 1 + accepted / len(steps),
                "draft_acceptance_rate": accepted / (k * len(steps)),
                "acceptance_histogram": histogram,
                "num_spec_steps": len(steps),
                "num_accepted_draft_tokens": accepted,
                "num_draft_tokens": k * len(steps),
                "num_spec_tokens": k,
            }
        }


def spec_steps(tokens: int, k: int, accept_pct: int) -> list[int]:
    """The drafted tokens each verification step accepts, for a stream of
    ``tokens`` output tokens with ``k`` drafted per step: step i accepts
    floor(P*k*(i+1)/100) - floor(P*k*i/100) of them (P = ``accept_pct``, so the
    running total tracks P percent of the drafts) and yields those plus the
    target model's own token; the last step is cut at the stream's end."""
    out: list[int] = []
    left = tokens
    i = 0
    while left > 0:
        a = (accept_pct * k * (i + 1)) // 100 - (accept_pct * k * i) // 100
        a = min(a, left - 1)
        out.append(a)
        left -= 1 + a
        i += 1
    return out


class BadRequest(Exception):
    pass


def _prompt_text(body: dict[str, Any], chat: bool) -> tuple[str, int]:
    """Canonical prompt text for hashing, and the fake prompt token count."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        words = 0
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                words += len(content.split())
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        words += len(part["text"].split())
        return json.dumps(messages, sort_keys=True, ensure_ascii=False), words + 3 * len(messages)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string or a list of strings")
    return prompt, max(1, len(prompt.split()))


def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name!r} must be an integer")
    return value


def make_plan(body: dict[str, Any], chat: bool, server_opts: Options) -> Plan:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required")
    opts, model_key = options_for_model(model, server_opts)
    if body.get("ignore_eos") is True:
        opts = replace(opts, ignore_eos=True)
    max_tokens = _int_field(body, "max_completion_tokens", None)
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", None)
    if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS_CAP:
        raise BadRequest(f"'max_tokens' must be in 1..{MAX_TOKENS_CAP}")
    n = _int_field(body, "n", 1) or 1
    if not 1 <= n <= 16:
        raise BadRequest("'n' must be in 1..16")
    seed = _int_field(body, "seed", None)
    stream = body.get("stream") is True
    so = body.get("stream_options")
    include_usage = isinstance(so, dict) and so.get("include_usage") is True
    prompt, prompt_tokens = _prompt_text(body, chat)
    root = f"{model_key}|{prompt}|{seed}"
    digest = _h(root, chat)
    plan = Plan(
        chat=chat,
        model=model,
        stream=stream,
        include_usage=include_usage,
        opts=opts,
        ident=("chatcmpl-" if chat else "cmpl-") + f"{digest:016x}",
        created=1_700_000_000 + digest % 10_000_000,
        prompt_tokens=prompt_tokens,
    )
    for c in range(n):
        key = f"{root}|{c}"
        natural = 16 + _h(key, "len") % 48
        if opts.ignore_eos:
            natural = max_tokens if max_tokens is not None else natural
        budget = max_tokens if max_tokens is not None else MAX_TOKENS_CAP
        reasoning: list[str] = []
        if opts.reasoning:
            r_count = 6 + _h(key, "rlen") % 10
            reasoning = generate_pieces("english", key + "#reasoning", r_count)[:budget]
        budget -= len(reasoning)
        tool_name = tool_id = None
        tool_args: list[str] = []
        content: list[str] = []
        finish = "stop"
        if opts.tool_calls and chat:
            tool_name, tool_id, tool_args = _tool_call(key)
            finish = "tool_calls"
        else:
            pieces = generate_pieces(opts.flavour, key, natural, opts.perturb_after)
            tokens = pieces_to_tokens(pieces, key, opts.style, opts.fffd)
            if len(tokens) > budget or (opts.ignore_eos and len(tokens) >= budget):
                tokens = tokens[: max(0, budget)]
                finish = "length"
            content = tokens
        plan.choices.append(
            ChoicePlan(c, reasoning, content, tool_name, tool_id, tool_args, finish)
        )
    return plan


def _tool_call(key: str) -> tuple[str, str, list[str]]:
    name = ("get_weather", "search_docs", "lookup_order")[_h(key, "tool") % 3]
    words = generate_pieces("english", key + "#args", 3)
    args = json.dumps(
        {"query": "".join(words).strip(), "limit": 1 + _h(key, "lim") % 9, "unit": "celsius"}
    )
    pieces: list[str] = []
    i = 0
    while i < len(args):
        step = 1 + _h(key, "argsplit", i) % 6
        pieces.append(args[i : i + step])
        i += step
    return name, f"call_{_h(key, 'id'):012x}"[:17], pieces


# ---------------------------------------------------------------------------
# Plan → SSE events / JSON body
# ---------------------------------------------------------------------------

Event = dict[str, Any] | str  # a JSON payload, "[DONE]", or ": comment"


def _group(items: list[str], k: int) -> list[str]:
    return ["".join(items[i : i + k]) for i in range(0, len(items), k)]


def _choice_chunks(plan: Plan, c: ChoicePlan) -> list[tuple[str, Any]]:
    """(kind, value) per output chunk of one choice, in order."""
    k = plan.opts.tokens_per_chunk
    out: list[tuple[str, Any]] = [("reasoning", r) for r in _group(c.reasoning, k)]
    if c.tool_name is not None:
        out.append(("tool_start", None))
        out.extend(("tool_args", a) for a in _group(c.tool_args, k))
    else:
        steps = _step_sizes(plan, c)
        if steps is not None and plan.opts.style != "llamacpp":
            # a speculating vLLM sends each verification step's tokens in one chunk
            out.extend(("content", "".join(c.content[a:b])) for a, b in pairwise(steps))
        else:
            out.extend(("content", t) for t in _group(c.content, k))
    return out


def _step_sizes(plan: Plan, c: ChoicePlan) -> list[int] | None:
    """Where each verification step begins in the choice's content tokens (and
    the end), when the server speculates and the content is all it generates
    (one choice, no reasoning, no tool call); else None."""
    spec = plan.spec()
    if spec is None or len(plan.choices) != 1 or c.reasoning or c.tool_name is not None:
        return None
    return [0, *accumulate(1 + a for a in spec)]


def step_pauses(plan: Plan, writes: list[list[Event]]) -> list[bool]:
    """Which writes the server waits ``delay`` before: every one but the first,
    except that a speculating llama.cpp writes the tokens one verification
    step accepted back to back (one event each) and waits only before a step's
    first token: the cadence of speculative decoding seen on the wire."""
    pauses = [i > 0 for i in range(len(writes))]
    c = plan.choices[0] if plan.choices else None
    steps = _step_sizes(plan, c) if c is not None and plan.opts.style == "llamacpp" else None
    if steps is None:
        return pauses
    starts = set(steps[:-1])
    token = 0
    for i, write in enumerate(writes):
        content = [  # (a "" token of llama.cpp's is a token)
            e
            for e in write
            if isinstance(e, dict)
            and any("content" in (ch.get("delta") or {}) for ch in e.get("choices") or [])
        ]
        pauses[i] = bool(content) and token in starts
        token += len(content)
    return pauses


def build_events(plan: Plan) -> list[list[Event]]:
    """The stream as a list of writes, each a list of SSE events."""
    style = plan.opts.style
    obj = "chat.completion.chunk" if plan.chat else "text_completion"

    def envelope(choices: list[dict[str, Any]]) -> dict[str, Any]:
        env: dict[str, Any] = {
            "id": plan.ident,
            "object": obj,
            "created": plan.created,
            "model": plan.model,
        }
        if plan.chat:
            env["system_fingerprint"] = "" if style == "transformers" else "fp_fixture"
        env["choices"] = choices
        return env

    def choice(index: int, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        if plan.chat:
            if style == "transformers":
                d: dict[str, Any] = {"index": index, "delta": {"role": "assistant", **delta}}
                if finish is not None:
                    d["finish_reason"] = finish
                return d
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "index": index,
            "text": delta.get("content", ""),
            "logprobs": None,
            "finish_reason": finish,
        }

    events: list[Event] = []
    if plan.chat:
        prelude: dict[str, Any] = (
            {"role": "assistant"} if style == "llamacpp" else {"role": "assistant", "content": ""}
        )
        for c in plan.choices:
            events.append(envelope([choice(c.index, dict(prelude), None)]))
    per_choice = [_choice_chunks(plan, c) for c in plan.choices]
    pos = [0] * len(plan.choices)
    finished = [False] * len(plan.choices)
    output_chunks = 0
    fail_at = plan.opts.fail_after
    spec = plan.spec()  # (a failed stream ends before the chunk that would report it)
    while not all(finished):
        for ci, c in enumerate(plan.choices):
            if finished[ci]:
                continue
            if fail_at is not None and output_chunks >= fail_at:
                events.append(
                    {
                        "error": {
                            "message": f"fixture: simulated failure after {output_chunks} chunks",
                            "type": "server_error",
                            "code": 500,
                        }
                    }
                )
                return _writes(plan, events)
            if pos[ci] < len(per_choice[ci]):
                kind, value = per_choice[ci][pos[ci]]
                pos[ci] += 1
                output_chunks += 1
                events.append(envelope([choice(c.index, _delta(c, kind, value), None)]))
                continue
            finished[ci] = True
            fin = envelope([choice(c.index, {}, c.finish_reason)])
            if style == "transformers" and all(finished):
                fin["usage"] = plan.usage()
            events.append(fin)
    if plan.include_usage and style != "transformers":
        usage = envelope([])
        usage["usage"] = plan.usage()
        events.append(usage)
    if spec is not None:
        # on the last chunk (the usage chunk with include_usage, else the last
        # finish chunk), as llama-server and vLLM put them
        last = events[-1]
        assert isinstance(last, dict)
        if style == "llamacpp":
            last["timings"] = plan.llamacpp_timings(spec)
        else:
            last["metrics"] = plan.vllm_metrics(spec)
    if style != "transformers":
        events.append("[DONE]")
    return _writes(plan, events)


def _delta(c: ChoicePlan, kind: str, value: str) -> dict[str, Any]:
    """The delta of one output chunk of choice ``c``."""
    if kind == "reasoning":
        return {"reasoning_content": value}
    if kind == "content":
        return {"content": value}
    if kind == "tool_start":
        return {
            "tool_calls": [
                {
                    "index": 0,
                    "id": c.tool_id,
                    "type": "function",
                    "function": {"name": c.tool_name, "arguments": ""},
                }
            ]
        }
    return {"tool_calls": [{"index": 0, "function": {"arguments": value}}]}


def _writes(plan: Plan, events: list[Event]) -> list[list[Event]]:
    style = plan.opts.style
    if style == "transformers":
        # several events per write, as transformers serve does under load
        writes: list[list[Event]] = []
        i = 0
        while i < len(events):
            size = 1 + _h(plan.ident, "w", i) % 3
            writes.append(events[i : i + size])
            i += size
        return writes
    if style == "llamacpp":
        writes = [[": ping - 2025-01-01 00:00:00.000000+00:00"]]
        for i, e in enumerate(events):
            if i and i % 8 == 0:
                writes.append([": ping - 2025-01-01 00:00:15.000000+00:00"])
            writes.append([e])
        return writes
    return [[e] for e in events]


def encode_write(events: list[Event], style: str) -> bytes:
    sep = "\r\n" if style == "llamacpp" else "\n"
    parts: list[str] = []
    for e in events:
        if isinstance(e, str) and e.startswith(":"):
            parts.append(e + sep + sep)
        elif isinstance(e, str):
            parts.append(f"data: {e}{sep}{sep}")
        else:
            # vLLM/OpenAI/transformers send compact JSON; llama-cpp-python uses json.dumps
            seps = (", ", ": ") if style == "llamacpp" else (",", ":")
            payload = json.dumps(e, ensure_ascii=False, separators=seps)
            parts.append(f"data: {payload}{sep}{sep}")
    return "".join(parts).encode()


def build_body(plan: Plan) -> dict[str, Any]:
    """The non-streaming response."""
    choices: list[dict[str, Any]] = []
    for c in plan.choices:
        if plan.chat:
            message: dict[str, Any] = {"role": "assistant", "content": c.text}
            if c.reasoning:
                message["reasoning_content"] = "".join(c.reasoning)
            if c.tool_name is not None:
                message["content"] = None
                message["tool_calls"] = [
                    {
                        "id": c.tool_id,
                        "type": "function",
                        "function": {"name": c.tool_name, "arguments": "".join(c.tool_args)},
                    }
                ]
            choices.append(
                {
                    "index": c.index,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
            )
        else:
            choices.append(
                {
                    "index": c.index,
                    "text": c.text,
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
            )
    body: dict[str, Any] = {
        "id": plan.ident,
        "object": "chat.completion" if plan.chat else "text_completion",
        "created": plan.created,
        "model": plan.model,
        "choices": choices,
        "usage": plan.usage(),
    }
    spec = plan.spec()
    if spec is not None:
        if plan.opts.style == "llamacpp":
            body["timings"] = plan.llamacpp_timings(spec)
        else:
            body["metrics"] = plan.vllm_metrics(spec)
    return body


# ---------------------------------------------------------------------------
# ASGI
# ---------------------------------------------------------------------------


async def _send_json(
    send: Send, status: int, obj: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps(obj, ensure_ascii=False).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _error(message: str, kind: str = "invalid_request_error", code: int = 400) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


async def _read_body(receive: Receive) -> bytes | None:
    """The request body; None when the client left; TOO_LARGE above MAX_BODY."""
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return TOO_LARGE
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(chunks)


def make_app(options: Options | None = None) -> ASGIApp:
    """The ASGI application with the given server-wide options."""
    server_opts = options or Options()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        method: str = scope["method"]
        path: str = scope["path"]
        if method == "GET" and path == "/health":
            await _send_json(send, 200, {"status": "ok"})
            return
        if method == "GET" and path == "/v1/models":
            data = [
                {"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "fixture"}
                for m in MODELS
            ]
            await _send_json(send, 200, {"object": "list", "data": data})
            return
        if path not in ("/v1/chat/completions", "/v1/completions"):
            await _send_json(send, 404, _error(f"no route {path}", "not_found", 404))
            return
        if method != "POST":
            await _send_json(send, 405, _error("method not allowed", "invalid_request_error", 405))
            return
        raw = await _read_body(receive)
        if raw is None:
            return
        if raw is TOO_LARGE:
            await _send_json(send, 413, _error("request body too large", code=413))
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            plan = make_plan(body, path == "/v1/chat/completions", server_opts)
        except (ValueError, BadRequest) as exc:
            await _send_json(send, 400, _error(str(exc)))
            return
        if not plan.stream:
            if plan.opts.fail_after is not None:
                err = _error("fixture: simulated failure", "server_error", 500)
                await _send_json(send, 500, err)
                return
            await _send_json(send, 200, build_body(plan))
            return
        await _stream(plan, receive, send)

    return app


async def _stream(plan: Plan, receive: Receive, send: Send) -> None:
    style = plan.opts.style
    headers = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
    ]
    if style == "llamacpp":
        headers += [(b"x-accel-buffering", b"no"), (b"connection", b"close")]
    disconnected = asyncio.Event()

    async def watch() -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                disconnected.set()
                return

    watcher = asyncio.create_task(watch())
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        delay = plan.opts.delay_ms / 1000.0
        writes = build_events(plan)
        pauses = step_pauses(plan, writes)
        for i, write in enumerate(writes):
            if disconnected.is_set():
                return
            if delay and pauses[i]:
                await asyncio.sleep(delay)
            data = encode_write(write, style)
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        watcher.cancel()
