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
  (``ids`` "server"); otherwise the text re-encoded with this model's
  tokenizer (``ids`` "retokenized": a fork may then sit a few tokens away from
  where the server forked);
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

import json
import math
import os
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
class _Seq:
    job: int
    side: str
    ids: list[int]  # context + continuation
    start: int  # index of the first scored token (the fork)


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
        done = 0
        total = len(order)
        batch: list[int] = []
        for i in order:
            width = len(seqs[i].ids)
            if batch and width * (len(batch) + 1) > BATCH_TOKENS:
                self._run(batch, seqs, scored)
                done += len(batch)
                if progress is not None:
                    progress(done, total)
                batch = []
            batch.append(i)
        if batch:
            self._run(batch, seqs, scored)
            done += len(batch)
            if progress is not None:
                progress(done, total)
        for j, job in enumerate(jobs):
            if job.result is None:
                job.result = self._result(
                    meta[j], scored.get((j, "baseline"), []), scored.get((j, "candidate"), [])
                )

    def _prepare(self, j: int, job: ScoreJob, seqs: list[_Seq]) -> dict[str, Any]:
        ctx = self.prompt_ids(job.request_json)
        if ctx is None:
            return {"error": "the request has no prompt the model can render"}
        bs = self._server_ids(job.baseline_logprobs, job.baseline_text)
        cs = self._server_ids(job.candidate_logprobs, job.candidate_text)
        unit = "server"
        if bs is None or cs is None:
            bs, cs, unit = (
                self._encode(job.baseline_text),
                self._encode(job.candidate_text),
                "retokenized",
            )
        k = 0
        while k < len(bs) and k < len(cs) and bs[k] == cs[k]:
            k += 1
        if k == len(bs) and k == len(cs):
            return {"error": "the two outputs have the same token ids in this model's tokenizer"}
        if not ctx:
            bos = self.tokenizer.bos_token_id
            if bos is None:
                return {"error": "no prompt and no BOS token: the first token has no context"}
            ctx = [bos]
        base = len(ctx) + k
        m: dict[str, Any] = {"ids": unit, "context_tokens": len(ctx), "fork_token": k}
        eos = self.tokenizer.eos_token_id
        finishes = {"baseline": job.baseline_finish, "candidate": job.candidate_finish}
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

    def _run(
        self,
        batch: Sequence[int],
        seqs: Sequence[_Seq],
        out: dict[tuple[int, str], list[tuple[int, float, int]]],
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
            "context_tokens": m["context_tokens"],
            "fork_token": m["fork_token"],
        }
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
