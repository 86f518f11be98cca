"""Reference-model attribution: how plausible each side's continuation is to a local LM.

A :class:`ReferenceModel` wraps a local Hugging Face causal LM (a directory,
or an id already in the local cache: it is never downloaded — ``local_files_only``
and ``HF_HUB_OFFLINE``) on the CPU. :meth:`ReferenceModel.score` takes
:class:`ScoreJob` values — the request (its messages or prompt) and the two
sides' outputs — and, for each, scores both continuations *from the common
prefix*:

* the context is the prompt as the server would have rendered it (the model's
  own chat template with ``add_generation_prompt`` for chat requests; the
  prompt text, with the tokenizer's special tokens, for completions), followed
  by the common prefix of the two outputs' token ids;
* the outputs' token ids are the server's own when the stream's logprobs gave
  every token's bytes and those bytes map to ids of this model's tokenizer
  (``ids`` "server", ``fork_scoring`` "tokens": the two fork tokens are scored);
* otherwise (``ids`` "retokenized", ``fork_scoring`` "text") the fork is found
  in the text and scored in this model's own tokenization of the shared
  prefix: re-encoding each side's whole text may put the fork a few tokens
  away from where the server generated it (non-canonical token sequences,
  bytes lost to U+FFFD), so the first differing character (``fork_char``) is
  mapped back to the start of the word holding it (``scored_from_char``: the
  pre-tokenizer's piece, or the last token of the shared prefix's encoding),
  the context is the prompt plus the shared prefix up to there in this
  model's tokenization, and the token paths that spell the shared rest of the
  word are followed (likeliest first); each side is scored on its likeliest
  path through the fork (a path through the shared rest of the word, then a
  token that covers the differing character; a U+FFFD in the text stands for
  the likeliest token whose bytes are not valid UTF-8, ``fork_bytes_lost``):
  its fork surprisal is measured from the likelier of the two sides' paths
  through the shared part (on the same path, the plain surprisal of each
  side's token) — the model's own choice between the two sides at the fork,
  whatever tokens the server used. ``fork_text_logprob``: the probability of
  the side's text through the fork given the shared part, every path summed.
  ``fork_paths`` counts the token paths followed (at most
  :data:`MAX_FORK_PASSES`; one forward pass each after the first, whose
  distribution comes with the continuations' batch); the continuation
  figures score each side's text from ``scored_from_char`` in this model's
  tokens;
* per side: the log-probability of every continuation token, the surprisal
  (−log p, nats) of the side's token at the fork, the cumulative and mean
  log-probability of the continuation, and its tokens of highest surprisal;
* ``preferred_at_fork``: the side whose fork token the model finds more
  likely (a side that stopped at the fork with finish reason ``stop`` is
  scored on the model's EOS token there); ``preferred_overall``: the side
  with the higher mean per-token log-probability over its continuation
  (length-normalised: the sides' continuations differ in length).

Jobs run in batches bounded by a token budget (the logits of a batch are
batch × length × vocabulary floats). torch and transformers' model classes are
imported on first use: without torch, :class:`ReferenceUnavailable` says so.
"""

from __future__ import annotations

import heapq
import json
import math
import os
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sniffer.llm.logprobs import TokenLogprob

__all__ = [
    "ReferenceModel",
    "ReferenceModelError",
    "ReferenceUnavailable",
    "ScoreJob",
    "prompt_messages",
]

#: Continuation tokens scored per side (the rest are left out, counted).
MAX_CONTINUATION = 512
#: Tokens of highest surprisal listed per side.
TOP_SURPRISAL = 5
#: Forward passes per pair for a fork scored on text (token paths through the word).
MAX_FORK_PASSES = 24
#: A token path whose probability falls this many nats below the likeliest one
#: through the shared window is dropped.
FORK_PATH_PRUNE = 12.0
#: Tokens with lost bytes (U+FFFD in the text) followed per position of a text fork.
WILD_PATHS = 3
#: The word holding a text fork is looked back at most this many characters.
MAX_FORK_WINDOW = 32
#: Batch budget: sequences × padded length. The logits kept are at most this many
#: rows of the vocabulary (1024 × 129,280 float32 = 0.5 GB for DeepSeek's).
BATCH_TOKENS = 1024


class ReferenceModelError(RuntimeError):
    """The reference model cannot be used (missing, not loadable)."""


class ReferenceUnavailable(ReferenceModelError):
    """torch (or the model classes) is not installed."""


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
        return "".join(parts)
    return ""


def prompt_messages(request: dict[str, Any]) -> tuple[list[dict[str, str]] | None, str | None]:
    """(chat messages, None) or (None, prompt text) of a parsed request body, for
    every dialect: OpenAI ``messages`` / ``prompt``, Anthropic ``system`` +
    ``messages``, Responses ``instructions`` + ``input``, TGI ``inputs``,
    Ollama ``messages`` / ``prompt``. (None, None) when there is neither."""
    system = request.get("system", request.get("instructions"))
    raw = request.get("messages")
    if raw is None and isinstance(request.get("input"), list):
        raw = request["input"]
    if raw is None and isinstance(request.get("input"), str):
        raw = [{"role": "user", "content": request["input"]}]
    if isinstance(raw, list):
        msgs: list[dict[str, str]] = []
        if system:
            msgs.append({"role": "system", "content": _text_of(system)})
        for m in raw:
            if isinstance(m, dict):
                msgs.append(
                    {"role": str(m.get("role", "user")), "content": _text_of(m.get("content"))}
                )
        return msgs, None
    for k in ("prompt", "inputs"):
        v = request.get(k)
        if isinstance(v, list) and len(v) == 1:
            v = v[0]
        if isinstance(v, str):
            return None, v
    return None, None


@dataclass(slots=True)
class ScoreJob:
    """One diverged pair to score: the request body and each side's output."""

    request_json: str | None
    baseline_text: str
    candidate_text: str
    baseline_logprobs: Sequence[TokenLogprob] | None = None
    candidate_logprobs: Sequence[TokenLogprob] | None = None
    baseline_finish: str | None = None  # "stop": a side that ends at the fork chose EOS
    candidate_finish: str | None = None
    result: dict[str, Any] | None = field(default=None)


@dataclass(slots=True)
class _TextFork:
    """A fork scored on text: the context up to the start of the word holding
    the fork, and each side's bytes from there (``None``: the side stopped there
    with EOS)."""

    ctx: list[int]
    window: bytes  # the bytes both sides share from the word's start
    rest: dict[str, bytes]  # per side: its bytes from the word's start
    stopped: dict[str, bool]  # per side: ended at the fork with finish "stop"


@dataclass(slots=True)
class _Vocab:
    """Every token's bytes, for finding the tokens that spell a piece of text."""

    exact: dict[bytes, list[int]]
    wild: dict[bytes, list[int]]  # invalid-UTF-8 tokens by their U+FFFD-replaced text
    keys: list[bytes]  # every token's bytes, sorted (prefix ranges)
    ids: list[int]  # the ids in ``keys`` order
    longest: int


def _successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with ``prefix``."""
    p = prefix.rstrip(b"\xff")
    return None if not p else p[:-1] + bytes([p[-1] + 1])


def _lse(values: Sequence[float]) -> float:
    finite = [v for v in values if v > -math.inf]
    if not finite:
        return -math.inf
    top = max(finite)
    return top + math.log(sum(math.exp(v - top) for v in finite))


@dataclass(slots=True)
class _Seq:
    job: int
    side: str
    ids: list[int]  # context + continuation
    start: int  # index of the first scored token (the fork)
    first_kept: bool = False  # keep the distribution there (a fork scored on text)


class ReferenceModel:
    """A local causal LM used to score continuations (CPU, float32, eval mode)."""

    def __init__(self, source: str) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import torch
        except ImportError as exc:
            raise ReferenceUnavailable(
                "--reference-model needs torch: pip install 'sparseety[reference]'"
            ) from exc
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:  # pragma: no cover - transformers is a dependency
            raise ReferenceUnavailable(f"--reference-model: {exc}") from exc
        self.source = source
        self._torch = torch
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            self.model = AutoModelForCausalLM.from_pretrained(
                source, local_files_only=True, dtype=torch.float32
            )
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ReferenceModelError(
                f"reference model {source!r} does not load (local files only): {first}"
            ) from exc
        self.model.eval()
        self.vocab = int(self.model.get_output_embeddings().weight.shape[0])
        self._byte_level = self._is_byte_level()
        self._vocab_index: _Vocab | None = None
        self._prefix_ids: dict[bytes, Any] = {}

    # -- token ids ---------------------------------------------------------

    def _is_byte_level(self) -> bool:
        try:
            data = json.loads(self.tokenizer.backend_tokenizer.to_str())
        except (AttributeError, ValueError):
            return False
        pre = json.dumps(data.get("pre_tokenizer")) + json.dumps(data.get("decoder"))
        return "ByteLevel" in pre

    def _server_ids(self, lps: Sequence[TokenLogprob] | None, text: str) -> list[int] | None:
        """This model's ids for the server's tokens (by their bytes), when every one maps
        and they decode to ``text``."""
        if not lps or not self._byte_level:
            return None
        from sniffer.llm.tokens import _bytes_to_byte_level

        ids: list[int] = []
        for t in lps:
            if t.id is not None and 0 <= t.id < self.vocab:
                ids.append(t.id)
                continue
            i = self.tokenizer.convert_tokens_to_ids(_bytes_to_byte_level(t.key))
            if not isinstance(i, int) or i == self.tokenizer.unk_token_id:
                i = self.tokenizer.convert_tokens_to_ids(t.text)  # an added token
            if not isinstance(i, int) or i == self.tokenizer.unk_token_id:
                return None
            ids.append(i)
        if self.tokenizer.decode(ids) != text:
            return None
        return ids

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def prompt_ids(self, request_json: str | None) -> list[int] | None:
        """The prompt as the server would have rendered it; None without one."""
        try:
            request = json.loads(request_json) if request_json else None
        except ValueError:
            return None
        if not isinstance(request, dict):
            return None
        msgs, prompt = prompt_messages(request)
        tok = self.tokenizer
        if msgs is not None:
            if getattr(tok, "chat_template", None):
                tools = request.get("tools") if isinstance(request.get("tools"), list) else None
                try:
                    text = tok.apply_chat_template(
                        msgs, tools=tools, add_generation_prompt=True, tokenize=False
                    )
                except Exception:  # a template that rejects this request: the fallback
                    text = None
                if isinstance(text, str):
                    return self._encode(text)
            text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs)
            return list(tok(text)["input_ids"])
        if prompt is not None:
            return list(tok(prompt)["input_ids"])
        return None

    # -- scoring -----------------------------------------------------------

    def score(
        self,
        jobs: Sequence[ScoreJob],
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Fill ``job.result`` of every job (see the module doc); ``progress(done, total)``."""
        seqs: list[_Seq] = []
        meta: dict[int, dict[str, Any]] = {}
        for j, job in enumerate(jobs):
            m = self._prepare(j, job, seqs)
            meta[j] = m
            if "error" in m:
                job.result = {"error": m["error"]}
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids))
        scored: dict[tuple[int, str], list[tuple[int, float, int]]] = {}
        # a text fork's first distribution: the continuations' first scored position
        first: dict[int, Any] = {}
        done = 0
        total = len(order)
        batch: list[int] = []
        for i in order:
            width = len(seqs[i].ids)
            if batch and width * (len(batch) + 1) > BATCH_TOKENS:
                self._run(batch, seqs, scored, first)
                done += len(batch)
                if progress is not None:
                    progress(done, total)
                batch = []
            batch.append(i)
        if batch:
            self._run(batch, seqs, scored, first)
            done += len(batch)
            if progress is not None:
                progress(done, total)
        for j, job in enumerate(jobs):
            if job.result is None:
                fork = meta[j].pop("text_fork", None)
                if fork is not None:
                    meta[j]["text_scores"] = self._score_text_fork(fork, first.get(j))
                job.result = self._result(
                    meta[j], scored.get((j, "baseline"), []), scored.get((j, "candidate"), [])
                )

    def _prepare(self, j: int, job: ScoreJob, seqs: list[_Seq]) -> dict[str, Any]:
        ctx = self.prompt_ids(job.request_json)
        if ctx is None:
            return {"error": "the request has no prompt the model can render"}
        if not ctx:
            bos = self.tokenizer.bos_token_id
            if bos is None:
                return {"error": "no prompt and no BOS token: the first token has no context"}
            ctx = [bos]
        bs = self._server_ids(job.baseline_logprobs, job.baseline_text)
        cs = self._server_ids(job.candidate_logprobs, job.candidate_text)
        finishes = {"baseline": job.baseline_finish, "candidate": job.candidate_finish}
        eos = self.tokenizer.eos_token_id
        m: dict[str, Any] = {"context_tokens": len(ctx)}
        if bs is None or cs is None:
            return self._prepare_text(j, job, ctx, m, seqs)
        k = 0
        while k < len(bs) and k < len(cs) and bs[k] == cs[k]:
            k += 1
        if k == len(bs) and k == len(cs):
            return {"error": "the two outputs have the same token ids in this model's tokenizer"}
        base = len(ctx) + k
        m.update(ids="server", fork_scoring="tokens", fork_token=k)
        for side, ids in (("baseline", bs), ("candidate", cs)):
            cont = ids[k : k + MAX_CONTINUATION]
            m[f"{side}_eos"] = False
            if not cont and finishes[side] == "stop" and isinstance(eos, int):
                cont = [eos]  # it stopped at the fork: its token there was EOS
                m[f"{side}_eos"] = True
            m[f"{side}_left_out"] = max(0, len(ids) - k - MAX_CONTINUATION)
            m[f"{side}_ids"] = cont
            if cont:
                seqs.append(_Seq(j, side, ctx + ids[:k] + cont, base))
        return m

    def _word_start(self, shared: str) -> int:
        """Where the word holding the end of ``shared`` starts: the start of the
        pre-tokenizer's piece holding its last character, or of the last token
        of its encoding, whichever is earlier (at most MAX_FORK_WINDOW back)."""
        if not shared:
            return 0
        enc = self.tokenizer(shared, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc.get("offset_mapping") or []
        start = offsets[-1][0] if offsets else len(shared)
        pre = getattr(getattr(self.tokenizer, "backend_tokenizer", None), "pre_tokenizer", None)
        if pre is not None:
            try:
                pieces = pre.pre_tokenize_str(shared)
            except Exception:  # a pre-tokenizer that cannot run alone
                pieces = []
            for _, (a, b) in pieces:
                if a < len(shared) <= b:
                    start = min(start, a)
        return max(0, len(shared) - MAX_FORK_WINDOW, min(start, len(shared)))

    def _prepare_text(
        self, j: int, job: ScoreJob, ctx: list[int], m: dict[str, Any], seqs: list[_Seq]
    ) -> dict[str, Any]:
        """Re-tokenized outputs: the fork found in the text and scored from the start
        of the word holding it, in this model's own tokenization of the shared prefix."""
        bt, ct = job.baseline_text, job.candidate_text
        char = 0
        while char < len(bt) and char < len(ct) and bt[char] == ct[char]:
            char += 1
        if char == len(bt) and char == len(ct):
            return {"error": "the two outputs have the same text"}
        s0 = self._word_start(bt[:char])
        prefix = self._encode(bt[:s0])
        k = len(prefix)
        base = len(ctx) + k
        m.update(
            ids="retokenized",
            fork_scoring="text",
            fork_token=k,
            fork_char=char,
            scored_from_char=s0,
        )
        eos = self.tokenizer.eos_token_id
        finishes = {"baseline": job.baseline_finish, "candidate": job.candidate_finish}
        rest: dict[str, bytes] = {}
        stopped: dict[str, bool] = {}
        for side, text in (("baseline", bt), ("candidate", ct)):
            ids = self._encode(text[s0:])
            stop = len(text) == char and finishes[side] == "stop" and isinstance(eos, int)
            cont = ids[:MAX_CONTINUATION] + ([eos] if stop and isinstance(eos, int) else [])
            m[f"{side}_eos"] = stop
            m[f"{side}_left_out"] = max(0, len(ids) - MAX_CONTINUATION)
            m[f"{side}_ids"] = cont
            rest[side] = text[s0:].encode("utf-8", "surrogatepass")
            stopped[side] = stop
            if cont:
                seqs.append(_Seq(j, side, ctx + prefix + cont, base, first_kept=True))
        window = 0
        rb, rc = rest["baseline"], rest["candidate"]
        while window < len(rb) and window < len(rc) and rb[window] == rc[window]:
            window += 1
        m["text_fork"] = _TextFork(ctx + prefix, rb[:window], rest, stopped)
        return m

    # -- forks scored on text ----------------------------------------------

    def _vocab(self) -> _Vocab | None:
        """Each token's bytes (byte-level BPE, or SentencePiece pieces with byte
        fallback); None for a tokenizer whose tokens' bytes cannot be told."""
        if self._vocab_index is not None:
            return self._vocab_index
        from sniffer.llm.tokens import _BYTE_CHARS

        tok = self.tokenizer
        special = set(getattr(tok, "all_special_ids", []) or [])
        inverse = {c: i for i, c in enumerate(_BYTE_CHARS)}
        pieces = tok.convert_ids_to_tokens(list(range(min(len(tok), self.vocab))))
        exact: dict[bytes, list[int]] = {}
        wild: dict[bytes, list[int]] = {}
        pairs: list[tuple[bytes, int]] = []
        for i, piece in enumerate(pieces):
            if i in special or not isinstance(piece, str) or not piece:
                continue
            raw: bytes | None
            if self._byte_level:
                try:
                    raw = bytes(inverse[c] for c in piece)
                except KeyError:
                    raw = None  # an added token outside the byte alphabet
            elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                try:
                    raw = bytes([int(piece[3:5], 16)])
                except ValueError:
                    raw = None
            else:
                raw = piece.replace("\u2581", " ").encode("utf-8", "surrogatepass")
            if not raw:
                continue
            exact.setdefault(raw, []).append(i)
            pairs.append((raw, i))
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                shown = raw.decode("utf-8", "replace").encode("utf-8")
                wild.setdefault(shown, []).append(i)
        if not pairs:
            return None
        pairs.sort()
        self._vocab_index = _Vocab(
            exact, wild, [p for p, _ in pairs], [i for _, i in pairs], max(len(p) for p in exact)
        )
        return self._vocab_index

    def _starting_with(self, v: _Vocab, prefix: bytes) -> Any:
        """Ids of the tokens whose bytes start with ``prefix`` and go past it (a tensor)."""
        got = self._prefix_ids.get(prefix)
        if got is None:
            lo = bisect_left(v.keys, prefix)
            up = _successor(prefix)
            hi = len(v.keys) if up is None else bisect_left(v.keys, up)
            ids = [v.ids[i] for i in range(lo, hi) if len(v.keys[i]) > len(prefix)]
            got = self._torch.tensor(ids, dtype=self._torch.long)
            if len(self._prefix_ids) < 4096:
                self._prefix_ids[prefix] = got
        return got

    def _spelling(
        self, v: _Vocab, rest: bytes, pos: int, lo: int, hi: int
    ) -> tuple[list[int], list[int], list[int], list[int]]:
        """(exact ids, their lengths, wild ids, their lengths): the tokens that spell
        ``rest[pos:pos + n]`` for ``lo <= n <= hi``; ``wild``: tokens whose bytes are
        not valid UTF-8, where the text shows U+FFFD (the bytes were lost: any of
        them may have been sent)."""
        exact: list[int] = []
        exact_n: list[int] = []
        wild: list[int] = []
        wild_n: list[int] = []
        for n in range(max(1, lo), min(v.longest, hi, len(rest) - pos) + 1):
            piece = rest[pos : pos + n]
            got = v.exact.get(piece, ())
            exact.extend(got)
            exact_n.extend([n] * len(got))
            if b"\xef\xbf\xbd" in piece:
                got = v.wild.get(piece, ())
                wild.extend(got)
                wild_n.extend([n] * len(got))
        return exact, exact_n, wild, wild_n

    def _next_logprobs(self, ids: list[int]) -> Any:
        torch = self._torch
        with torch.inference_mode():
            x = torch.tensor([ids], dtype=torch.long)
            try:
                logits = self.model(input_ids=x, logits_to_keep=1).logits[0, -1]
            except TypeError:  # a model class without logits_to_keep
                logits = self.model(input_ids=x).logits[0, -1]
            return torch.log_softmax(logits.float(), dim=-1)

    def _score_text_fork(self, f: _TextFork, root: Any = None) -> dict[str, Any]:
        """Each side's log-probability of its text through the first differing byte,
        given the shared text up to there: summed over the token paths that spell
        the shared window, then a token that covers the fork (see the module doc)."""
        v = self._vocab()
        if v is None:
            return {"error": "this tokenizer's tokens have no known bytes"}
        eos = self.tokenizer.eos_token_id
        end = len(f.window)
        torch = self._torch
        terms: dict[str, list[float]] = {"baseline": [], "candidate": []}
        best: dict[str, tuple[float, int, float] | None] = {"baseline": None, "candidate": None}
        lost = {"baseline": False, "candidate": False}
        shared: list[float] = []  # the probability of the shared window (the divisor)
        heap: list[tuple[float, int, int, list[int]]] = [(0.0, 0, 0, list(f.ctx))]
        passes = 0
        order = 0
        floor = -math.inf  # paths this far below the likeliest one met are dropped
        while heap and passes < MAX_FORK_PASSES:
            neg, _, pos, ids = heapq.heappop(heap)
            alpha = -neg
            if alpha < floor:
                break
            passes += 1
            # the first context's distribution came with the continuations' batch
            lp = root if pos == 0 and passes == 1 and root is not None else self._next_logprobs(ids)
            if pos == end:
                shared.append(alpha)
            else:
                cont = self._starting_with(v, f.window[pos:])
                if len(cont):
                    shared.append(alpha + float(self._torch.logsumexp(lp[cont], 0)))
            for side in ("baseline", "candidate"):
                if f.stopped[side]:
                    if pos == end and isinstance(eos, int):
                        self._add(terms, best, side, alpha + float(lp[eos]), eos, alpha)
                    continue
                exact, _, wild, _ = self._spelling(v, f.rest[side], pos, end - pos + 1, 1 << 30)
                if exact:
                    vals = lp[torch.tensor(exact, dtype=torch.long)]
                    i = int(vals.argmax())
                    total = float(torch.logsumexp(vals, 0))
                    self._add(terms, best, side, alpha + total, exact[i], alpha, float(vals[i]))
                if wild:  # lost bytes: only the likeliest of them (an upper bound)
                    vals = lp[torch.tensor(wild, dtype=torch.long)]
                    i = int(vals.argmax())
                    self._add(terms, best, side, alpha + float(vals[i]), wild[i], alpha)
                    lost[side] = True
            exact, exact_n, wild, wild_n = self._spelling(v, f.window, pos, 1, end - pos)
            children = list(zip(exact, exact_n, strict=True))
            if wild:
                vals = lp[torch.tensor(wild, dtype=torch.long)]
                top = vals.topk(min(WILD_PATHS, len(wild))).indices.tolist()
                children += [(wild[i], wild_n[i]) for i in top]
            for t, n in children:
                val = alpha + float(lp[t])
                floor = max(floor, val - FORK_PATH_PRUNE)
                if val >= floor:
                    order += 1
                    heapq.heappush(heap, (-val, order, pos + n, [*ids, t]))
        z = _lse(shared)
        out: dict[str, Any] = {"fork_paths": passes}
        # the fork's surprisal per side: its likeliest token path through the fork,
        # measured from the likelier of the two sides' paths through the shared
        # window (the same path on both sides: the plain surprisal of each token)
        top = max((b[2] for b in best.values() if b is not None), default=0.0)
        for side in ("baseline", "candidate"):
            b = best[side]
            out[f"{side}_logprob"] = None if b is None else min(0.0, b[0] - top)
            out[f"{side}_token"] = None if b is None else self._piece(b[1])
            out[f"{side}_bytes_lost"] = lost[side]
            total = _lse(terms[side])
            ok = total > -math.inf and z > -math.inf
            # the probability of the side's text through the fork, every path summed
            out[f"{side}_text_logprob"] = min(0.0, total - z) if ok else None
        return out

    @staticmethod
    def _add(
        terms: dict[str, list[float]],
        best: dict[str, tuple[float, int, float] | None],
        side: str,
        value: float,
        token: int,
        alpha: float,
        token_logprob: float | None = None,
    ) -> None:
        """Add a path's term to a side's sum; keep the side's likeliest (path, token)."""
        terms[side].append(value)
        joint = value if token_logprob is None else alpha + token_logprob
        b = best[side]
        if b is None or joint > b[0]:
            best[side] = (joint, token, alpha)

    def _run(
        self,
        batch: Sequence[int],
        seqs: Sequence[_Seq],
        out: dict[tuple[int, str], list[tuple[int, float, int]]],
        first: dict[int, Any] | None = None,
    ) -> None:
        torch = self._torch
        width = max(len(seqs[i].ids) for i in batch)
        pad = self.tokenizer.pad_token_id
        pad = 0 if pad is None else pad
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, i in enumerate(batch):
            row = seqs[i].ids
            ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[r, : len(row)] = 1
        # logits only from the first scored position on (the prompt and the common
        # prefix need none): the last ``keep`` positions of the padded batch
        keep = width - min(seqs[i].start - 1 for i in batch)
        with torch.inference_mode():
            try:
                logits = self.model(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits
            except TypeError:  # a model class without logits_to_keep
                logits = self.model(input_ids=ids, attention_mask=mask).logits
            offset = width - logits.shape[1]
            for r, i in enumerate(batch):
                s = seqs[i]
                pos = torch.arange(s.start - 1 - offset, len(s.ids) - 1 - offset)
                lp = torch.log_softmax(logits[r, pos].float(), dim=-1)
                if first is not None and s.first_kept and s.job not in first:
                    first[s.job] = lp[0].clone()  # what follows the shared context
                tgt = torch.tensor(s.ids[s.start :], dtype=torch.long)
                got = lp.gather(1, tgt[:, None])[:, 0].tolist()
                best = lp.argmax(dim=-1).tolist()
                out[(s.job, s.side)] = [
                    (t, float(v), int(b))
                    for t, v, b in zip(s.ids[s.start :], got, best, strict=True)
                ]

    def _piece(self, i: int) -> str:
        return str(self.tokenizer.decode([i]))

    def _result(
        self,
        m: dict[str, Any],
        b: list[tuple[int, float, int]],
        c: list[tuple[int, float, int]],
    ) -> dict[str, Any]:
        res: dict[str, Any] = {
            "model": self.source,
            "ids": m["ids"],
            "fork_scoring": m["fork_scoring"],
            "context_tokens": m["context_tokens"],
            "fork_token": m["fork_token"],
        }
        ts = m.get("text_scores")
        if ts is not None:
            res["fork_char"] = m["fork_char"]
            res["scored_from_char"] = m["scored_from_char"]
            res["fork_paths"] = ts.get("fork_paths", 0)
            if "error" in ts:
                res["fork_error"] = ts["error"]
        sides: dict[str, Any] = {}
        for side, got in (("baseline", b), ("candidate", c)):
            lps = [v for _, v, _ in got]
            top = sorted(range(len(got)), key=lambda i: lps[i])[:TOP_SURPRISAL]
            sides[side] = {
                "tokens": [self._piece(t) for t, _, _ in got],
                "logprobs": lps,
                "fork_token": self._piece(got[0][0]) if got else None,
                "fork_surprisal": -lps[0] if got else None,
                "cumulative_logprob": sum(lps),
                "mean_logprob": sum(lps) / len(lps) if lps else None,
                "scored_tokens": len(lps),
                "left_out_tokens": m[f"{side}_left_out"],
                "stopped_at_fork": m[f"{side}_eos"],  # its scored token is the EOS token
                "highest_surprisal": [
                    {
                        "index": m["fork_token"] + i,
                        "token": self._piece(got[i][0]),
                        "surprisal": -lps[i],
                    }
                    for i in sorted(top, key=lambda i: lps[i])
                ],
            }
        if ts is not None:  # the fork scored on text, not on the first continuation token
            for side in ("baseline", "candidate"):
                lp = ts.get(f"{side}_logprob")
                sides[side]["fork_surprisal"] = None if lp is None else -lp
                sides[side]["fork_token"] = ts.get(f"{side}_token")
                # U+FFFD at the fork: the likeliest token with invalid bytes stood in
                sides[side]["fork_bytes_lost"] = bool(ts.get(f"{side}_bytes_lost"))
                sides[side]["fork_text_logprob"] = ts.get(f"{side}_text_logprob")
        res["baseline"], res["candidate"] = sides["baseline"], sides["candidate"]
        fb, fc = sides["baseline"]["fork_surprisal"], sides["candidate"]["fork_surprisal"]
        # a side that stopped at the fork has no token there (its EOS is not scored)
        res["baseline_fork_surprisal"] = fb
        res["candidate_fork_surprisal"] = fc
        res["preferred_at_fork"] = _prefer(fb, fc, lower=True)
        mb, mc = sides["baseline"]["mean_logprob"], sides["candidate"]["mean_logprob"]
        res["preferred_overall"] = _prefer(mb, mc, lower=False)
        anchor = b or c
        res["reference_choice_at_fork"] = self._piece(anchor[0][2]) if anchor else None
        return res


def _prefer(b: float | None, c: float | None, *, lower: bool) -> str | None:
    if b is None or c is None or math.isnan(b) or math.isnan(c) or b == c:
        return None if b is None or c is None or b != c else "tie"
    if lower:
        return "baseline" if b < c else "candidate"
    return "baseline" if b > c else "candidate"
