"""``python -m tests.model_server DIR [--host H] [--port P]``: serve a local causal LM
(greedy, CPU) as OpenAI chat completions, streaming, with logprobs. See the package doc."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import torch
import uvicorn
from transformers import AutoModelForCausalLM, AutoTokenizer

from sniffer.llm.tokens import _BYTE_CHARS

_BYTE_OF = {c: b for b, c in enumerate(_BYTE_CHARS)}
MAX_TOP = 20


class Engine:
    def __init__(self, directory: str) -> None:
        self.tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(
            directory, local_files_only=True, dtype=torch.float32
        )
        self.model.eval()
        self.name = directory

    def token_bytes(self, i: int) -> bytes:
        piece = self.tok.convert_ids_to_tokens(i)
        if isinstance(piece, str) and all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        return str(self.tok.decode([i])).encode("utf-8")

    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        text = self.tok.apply_chat_template(
            body["messages"], add_generation_prompt=True, tokenize=False
        )
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def entry(self, i: int, lp: torch.Tensor, top: int) -> dict[str, Any]:
        raw = self.token_bytes(i)
        out: dict[str, Any] = {
            "token": raw.decode("utf-8", "replace"),
            "logprob": float(lp[i]),
            "bytes": list(raw),
            "top_logprobs": [],
        }
        if top:
            vals, idx = torch.topk(lp, top)
            for v, j in zip(vals.tolist(), idx.tolist(), strict=True):
                rj = self.token_bytes(j)
                out["top_logprobs"].append(
                    {"token": rj.decode("utf-8", "replace"), "logprob": v, "bytes": list(rj)}
                )
        return out


def _chunk(cid: str, model: str, delta: dict[str, Any], **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": extra.pop("logprobs", None),
              "finish_reason": extra.pop("finish_reason", None)}  # fmt: skip
    obj = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
           "model": model, "choices": [choice], **extra}  # fmt: skip
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def make_app(engine: Engine) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
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
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})  # fmt: skip
            await send({"type": "http.response.body", "body": b'{"status":"ok"}'})
            return
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        body = json.loads(raw)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"),
                                (b"cache-control", b"no-cache")]})  # fmt: skip
        model = str(body.get("model", engine.name))
        want_lp = bool(body.get("logprobs"))
        top = min(MAX_TOP, int(body.get("top_logprobs") or 0)) if want_lp else 0
        max_tokens = int(body.get("max_tokens") or 64)
        cid = f"chatcmpl-{time.monotonic_ns()}"

        async def emit(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        await emit(_chunk(cid, model, {"role": "assistant", "content": ""}))
        ids = engine.prompt_ids(body)
        past = None
        inp = torch.tensor([ids])
        generated: list[int] = []
        sent = ""
        finish = "length"
        with torch.inference_mode():
            for _ in range(max_tokens):
                out = engine.model(input_ids=inp, past_key_values=past, use_cache=True)
                past = out.past_key_values
                lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
                nxt = int(lp.argmax())
                if nxt == engine.tok.eos_token_id:
                    finish = "stop"
                    break
                generated.append(nxt)
                text = str(engine.tok.decode(generated))
                delta = "" if text.endswith("\ufffd") else text[len(sent) :]
                if delta:
                    sent = text
                lps = {"content": [engine.entry(nxt, lp, top)]} if want_lp else None
                await emit(_chunk(cid, model, {"content": delta}, logprobs=lps))
                await asyncio.sleep(0)
                inp = torch.tensor([[nxt]])
        text = str(engine.tok.decode(generated))
        if text != sent:  # a held-back tail (the last token ended inside a character)
            await emit(_chunk(cid, model, {"content": text[len(sent) :]}))
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(generated),
                 "total_tokens": len(ids) + len(generated)}  # fmt: skip
        await emit(_chunk(cid, model, {}, finish_reason=finish))
        obj = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
               "model": model, "choices": [], "usage": usage}  # fmt: skip
        await emit(b"data: " + json.dumps(obj).encode() + b"\n\n")
        await emit(b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("directory")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = Engine(args.directory)
    uvicorn.run(make_app(engine), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
