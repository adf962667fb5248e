#!/usr/bin/env python3
"""Train the small default model that ships inside octavo.

The model is a tiny Llama-architecture causal LM (~4.2M parameters) trained from
scratch on the Python standard library's own ``.py`` sources, together with a
4096-entry byte-level BPE tokenizer trained on the same corpus.  It is not meant
to be useful; it exists so that the engine has a real, self-contained Hugging
Face-format checkpoint (config.json, model.safetensors, tokenizer.json, chat
template, generation_config.json) to load, test and demo without downloads.

Everything is deterministic given the same CPython stdlib, library versions and
arguments: fixed seeds, sorted file lists, deterministic torch algorithms.  The
one exception is the wall-clock budget (``--minutes``): when it, rather than
``--steps``, ends the run, the step count depends on machine speed.  The number
of steps actually taken is written to the model card; rerun with
``--steps N --minutes 0`` to reproduce a run exactly.

Usage::

    python tools/train_default_model.py                 # 20 minute budget
    python tools/train_default_model.py --minutes 22
    python tools/train_default_model.py --steps 500 --minutes 0 --out /tmp/m
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import time
import tokenize
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOT_ID = 0  # <|endoftext|>: bos, eos and pad

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SAMPLE_PROMPTS = ["def ", "class ", "import "]

# config.json fields that only matter for training / legacy code paths.
DROP_CONFIG_FIELDS = ["pretraining_tp", "use_cache", "initializer_range", "attention_dropout"]

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


# --------------------------------------------------------------------------- #
# Corpus
# --------------------------------------------------------------------------- #
def stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                files.append(Path(dirpath) / name)
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    return root, files


def read_source(path: Path) -> str | None:
    try:
        with tokenize.open(path) as f:  # honours PEP 263 coding cookies
            return f.read()
    except (SyntaxError, UnicodeDecodeError, OSError):
        return None


def load_corpus() -> tuple[Path, list[tuple[str, str]]]:
    root, files = stdlib_files()
    docs = []
    for p in files:
        text = read_source(p)
        if text and text.strip():
            docs.append((p.relative_to(root).as_posix(), text))
    return root, docs


# --------------------------------------------------------------------------- #
# Tokenizer
# --------------------------------------------------------------------------- #
def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,  # ids 0, 1, 2 in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        extra_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=1024,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def build_stream(hf_tok, texts: list[str]) -> torch.Tensor:
    backend = hf_tok.backend_tokenizer
    ids: list[int] = []
    batch = 64
    for i in range(0, len(texts), batch):
        for enc in backend.encode_batch(texts[i : i + batch], add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(EOT_ID)
    return torch.tensor(ids, dtype=torch.long)


# --------------------------------------------------------------------------- #
# Model
# --------------------------------------------------------------------------- #
def make_config(vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=768,
        hidden_act="silu",
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=EOT_ID,
        eos_token_id=EOT_ID,
        pad_token_id=EOT_ID,
    )


def lr_at(progress: float, step: int, warmup: int, peak: float, min_ratio: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(max(progress, 0.0), 1.0)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model, val_windows: torch.Tensor, batch_size: int) -> float:
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(val_windows), batch_size):
        x = val_windows[i : i + batch_size]
        out = model(input_ids=x, labels=x)
        total += out.loss.item() * len(x)
        n += len(x)
    model.train()
    return total / max(n, 1)


@torch.no_grad()
def greedy(model, tok, prompt: str, n: int) -> str:
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
        eos_token_id=EOT_ID, pad_token_id=EOT_ID,
    )
    return tok.decode(out[0], skip_special_tokens=False)


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="octavo/assets/default_model")
    ap.add_argument("--minutes", type=float, default=20.0,
                    help="wall-clock budget for the training loop (0 = no limit)")
    ap.add_argument("--steps", type=int, default=5000, help="maximum optimizer steps")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--val-fraction", type=float, default=0.01)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--sample-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    t_start = time.time()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    import tokenizers
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:7.1f}s] {msg}", flush=True)

    # ---- corpus + tokenizer ------------------------------------------------
    root, docs = load_corpus()
    texts = [t for _, t in docs]
    n_chars = sum(len(t) for t in texts)
    log(f"corpus: {len(docs)} files, {n_chars:,} chars from {root}")

    tok = train_tokenizer(texts, args.vocab_size)
    vocab_size = len(tok)
    assert vocab_size == args.vocab_size, vocab_size
    log(f"tokenizer: vocab {vocab_size}")

    stream = build_stream(tok, texts)
    n_tokens = len(stream)
    n_val = max(int(n_tokens * args.val_fraction), args.seq_len * 8)
    train_ids, val_ids = stream[:-n_val], stream[-n_val:]
    n_val_windows = len(val_ids) // args.seq_len
    val_windows = val_ids[: n_val_windows * args.seq_len].view(n_val_windows, args.seq_len)
    log(f"stream: {n_tokens:,} tokens ({n_chars / n_tokens:.2f} chars/token); "
        f"train {len(train_ids):,}, val {len(val_ids):,} ({n_val_windows} windows)")

    # ---- model ---------------------------------------------------------------
    config = make_config(vocab_size)
    model = LlamaForCausalLM(config).float()
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    log(f"model: {n_params:,} parameters")

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )

    gen = torch.Generator().manual_seed(args.seed)
    max_start = len(train_ids) - args.seq_len - 1
    offsets = torch.arange(args.seq_len)

    budget_s = args.minutes * 60.0
    curve: list[dict] = []
    train_log: list[tuple[int, float]] = []
    running, running_n = 0.0, 0
    model.train()
    t_train = time.time()
    step = 0
    stop_reason = "steps"
    while step < args.steps:
        elapsed = time.time() - t_train
        if budget_s > 0 and elapsed >= budget_s:
            stop_reason = "time budget"
            break
        progress = step / args.steps
        if budget_s > 0:
            progress = max(progress, elapsed / budget_s)
        lr = lr_at(progress, step, args.warmup, args.lr, args.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr

        starts = torch.randint(0, max_start, (args.batch_size,), generator=gen)
        x = train_ids[starts[:, None] + offsets]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1

        running += loss.item()
        running_n += 1
        if step % args.log_every == 0:
            avg = running / running_n
            train_log.append((step, avg))
            running, running_n = 0.0, 0
            el = time.time() - t_train
            log(f"step {step:5d}  train {avg:.4f}  lr {lr:.2e}  {el / step:.2f}s/step")
        if step % args.eval_every == 0:
            vl = evaluate(model, val_windows, args.batch_size)
            tl = train_log[-1][1] if train_log else loss.item()
            curve.append({"step": step, "train_loss": round(tl, 4), "val_loss": round(vl, 4)})
            log(f"step {step:5d}  val {vl:.4f}")

    train_time = time.time() - t_train
    if running_n:
        train_log.append((step, running / running_n))
    final_train = train_log[-1][1] if train_log else float("nan")
    final_val = evaluate(model, val_windows, args.batch_size)
    if not curve or curve[-1]["step"] != step:
        curve.append({"step": step, "train_loss": round(final_train, 4),
                      "val_loss": round(final_val, 4)})
    log(f"stopped ({stop_reason}) after {step} steps in {train_time:.0f}s: "
        f"train {final_train:.4f} val {final_val:.4f}")

    # ---- save ----------------------------------------------------------------
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(
        bos_token_id=EOT_ID, eos_token_id=EOT_ID, pad_token_id=EOT_ID, do_sample=False,
    )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)

    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for k in DROP_CONFIG_FIELDS:
        cfg.pop(k, None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    # Portable tokenizer_config.json: a class name every transformers version knows
    # (v5 writes its internal "TokenizersBackend"), and the chat template inline too,
    # for readers that do not look at chat_template.jinja.
    tcfg_path = out / "tokenizer_config.json"
    tcfg = json.loads(tcfg_path.read_text())
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tcfg["chat_template"] = CHAT_TEMPLATE
    tcfg_path.write_text(json.dumps(tcfg, indent=2, sort_keys=True) + "\n")

    # ---- reload what was written and check it --------------------------------
    tok2 = AutoTokenizer.from_pretrained(out)
    model2 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model2.eval()
    saved_val = evaluate(model2, val_windows, args.batch_size)
    log(f"reloaded bf16 weights: val loss {saved_val:.4f}")
    samples = []
    for p in SAMPLE_PROMPTS:
        s = greedy(model2, tok2, p, args.sample_tokens)
        samples.append((p, s))
        log(f"sample {p!r}:\n{s}\n" + "-" * 40)
    chat_demo = tok2.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)

    weights_size = (out / "model.safetensors").stat().st_size

    # ---- model card ----------------------------------------------------------
    card = render_card(
        args=args, root=root, n_files=len(docs), n_chars=n_chars, n_tokens=n_tokens,
        n_train=len(train_ids), n_val=len(val_ids), config=cfg, n_params=n_params,
        weights_size=weights_size, steps=step, train_time=train_time,
        stop_reason=stop_reason, curve=curve, final_train=final_train,
        final_val=final_val, saved_val=saved_val, samples=samples, chat_demo=chat_demo,
        versions={"python": platform.python_version(), "torch": torch.__version__,
                  "transformers": transformers.__version__,
                  "tokenizers": tokenizers.__version__},
    )
    (out / "README.md").write_text(card)
    for f in out.iterdir():  # safetensors writes 0600; package data should be world-readable
        f.chmod(0o644)
    # The card's own size is small; report the folder total after writing it.
    total = dir_size(out)
    log(f"saved to {out}: " + ", ".join(
        f"{p.name} {p.stat().st_size:,}B" for p in sorted(out.iterdir())))
    log(f"total {total:,} bytes ({total / 2**20:.2f} MiB); wall {time.time() - t_start:.0f}s")


def render_card(*, args, root, n_files, n_chars, n_tokens, n_train, n_val, config, n_params,
                weights_size, steps, train_time, stop_reason, curve, final_train, final_val,
                saved_val, samples, chat_demo, versions) -> str:
    rows = "\n".join(f"| {c['step']} | {c['train_loss']:.4f} | {c['val_loss']:.4f} |"
                     for c in curve)
    sample_md = "\n\n".join(
        f"Prompt `{p!r}`:\n\n```python\n{s}\n```" for p, s in samples)
    tokens_seen = steps * args.batch_size * args.seq_len
    if args.minutes > 0:
        schedule_note = (f"The cosine follows whichever of the step limit ({args.steps}) and the\n"
                         f"  time budget ({args.minutes:g} min) is closer to running out.")
    else:
        schedule_note = f"The cosine follows the step limit ({args.steps}; no time budget)."
    return f"""---
license: psf-2.0
library_name: transformers
pipeline_tag: text-generation
tags: [llama, tiny, test-model, octavo]
---

# octavo default model

A tiny Llama-architecture causal language model that ships inside octavo so the
engine always has a real, self-contained Hugging Face checkpoint to load, test and
demo without downloading anything. It was trained from scratch, for {train_time / 60:.0f} minutes
on two CPU cores, on the Python standard library's source code. It continues Python
code in a recognisable style but is **not** a useful model: expect repetition,
invented APIs and no instruction following. The chat template exists only so that
chat-style APIs can be exercised.

Produced by `tools/train_default_model.py` (see that file to rebuild it).

## License

* **Training data**: the source code of the CPython {versions['python']} standard library, which is
  distributed under the **Python Software Foundation License Version 2** (PSF-2.0; SPDX
  `PSF-2.0`), © Python Software Foundation. The weights and tokenizer are derived from
  that text, so this card states `license: psf-2.0`.
* **octavo** itself (the engine, and the script that trained this model) is Apache-2.0;
  see the `LICENSE` file of the octavo distribution.

## Corpus

* CPython {versions['python']} standard library: every `.py` file in the interpreter's standard library directory (`sysconfig.get_paths()["stdlib"]`)
  in sorted order, skipping `site-packages/`, `test/`, `tests/` and `idle_test/`
  directories: **{n_files} files**, {n_chars:,} characters.
* Each file's text is followed by `<|endoftext|>`; the files are tokenized and
  concatenated into one stream of **{n_tokens:,} tokens** ({n_chars / n_tokens:.2f}
  characters per token). The last {n_val:,} tokens (~{args.val_fraction:.0%}) are held out
  for validation; training uses the first {n_train:,}.

## Tokenizer

Byte-level BPE (`tokenizers`), trained on the same corpus, vocabulary **{config['vocab_size']}**.
Special tokens: `<|endoftext|>` = 0 (bos, eos and pad), `<|im_start|>` = 1,
`<|im_end|>` = 2. No tokens are added automatically when encoding. ChatML chat
template; with `add_generation_prompt` a single user turn `hi` renders as:

```
{chat_demo}```

## Architecture

`LlamaForCausalLM`: hidden size {config['hidden_size']}, {config['num_hidden_layers']} layers,
{config['num_attention_heads']} attention heads of dim {config['head_dim']},
{config['num_key_value_heads']} key/value heads (grouped-query attention), SwiGLU MLP of
{config['intermediate_size']}, RMSNorm eps {config['rms_norm_eps']}, RoPE theta
{config['rope_parameters']['rope_theta']:g}, max positions {config['max_position_embeddings']},
tied input/output embeddings.

* Parameters: **{n_params:,}** (tied embedding counted once).
* Weights: `model.safetensors`, bfloat16, {weights_size:,} bytes ({weights_size / 2**20:.2f} MiB).

## Training

* Sequence length {args.seq_len}, batch {args.batch_size} sequences (random windows of the
  training stream), float32, `torch.set_num_threads({args.threads})`, seed {args.seed}.
* AdamW (betas 0.9/0.95, weight decay {args.weight_decay} on matrices), peak lr {args.lr:g},
  {args.warmup} warmup steps then cosine decay to {args.min_lr_ratio:g}x peak, gradient clip
  {args.grad_clip:g}. {schedule_note}
* Ran **{steps} steps** in {train_time / 60:.1f} min (stopped by {stop_reason}), about
  {tokens_seen / 1e6:.2f}M training tokens ({tokens_seen / n_train:.2f} epochs).
  Reproduce exactly with `--steps {steps} --minutes 0`.
* Software: Python {versions['python']}, torch {versions['torch']}, transformers
  {versions['transformers']}, tokenizers {versions['tokenizers']}.

### Loss (cross-entropy, nats/token)

Train loss is the mean over the last {args.log_every} steps; val loss is over all
{n_val // args.seq_len} held-out windows.

| step | train | val |
|---:|---:|---:|
{rows}

Final: train {final_train:.4f}, val {final_val:.4f} (float32 weights);
val {saved_val:.4f} after rounding to the shipped bfloat16 weights.

## Samples

Greedy decoding, {args.sample_tokens} new tokens, from the saved bfloat16 weights.
The byte-level BPE attaches a leading space to the following word (`" foo"` is one
token), so a prompt that ends in a space, like these, leaves a lone space token the
model rarely saw in training; prompts that end at a word or line boundary
(`"def fibonacci(n):"`, `"import os\\n"`) continue more naturally.

{sample_md}
"""


if __name__ == "__main__":
    sys.exit(main())
