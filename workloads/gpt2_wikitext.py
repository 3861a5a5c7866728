"""gpt2-wikitext: a GPT-2 causal language model on wikitext-2-raw-v1, through the
transformers Trainer.

It trains through ``Trainer`` with ``TrainingArguments(deepspeed=ds_config)``, the
transformers integration (https://huggingface.co/docs/transformers/deepspeed), not the
DeepSpeed engine directly, with the config dsenv plans (preset, derived batch, learning
rate, schedule), whose values the TrainingArguments repeat so that the integration's
consistency check passes. The data set is read with ``load_from_disk`` from a folder
``save_to_disk`` wrote, as a job on a compute node without internet reads it: `dsenv fetch
gpt2-wikitext` writes the real one, the smoke writes a synthetic one in its layout (a
``text`` column of wikitext lines: " = Title = " headings, blank lines, spaced
punctuation). Lines are tokenized, concatenated and cut into blocks (``group_texts`` of the
Hugging Face language-modeling notebook, github.com/huggingface/notebooks:
examples/language_modeling.ipynb); the metric is perplexity, exp of the validation loss.

The smoke (``dsenv smoke gpt2-wikitext``) needs nothing from the network: a tiny GPT-2
from a GPT2Config and a byte-level BPE tokenizer trained here. The full run (``dsenv run
gpt2-wikitext``) fine-tunes distilgpt2 at the notebook's learning rate (2e-5), one epoch.

Reads top to bottom: settings, assets, data, the Trainer, evaluation, training, the run.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from dsenv.workloads import registry, runner, synthetic, tiny
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.training import engine
from dsenv.workloads.training.opbuild import reported

NAME = "gpt2-wikitext"
COLUMNS = ("text",)
SPLITS = ("train", "validation")
THRESHOLDS = ("min_loss_drop", "max_perplexity")  # Settings fields
PACKAGES = {"accelerate": "accelerate"}  # module -> distribution, beyond torch/transformers
OPTIONS = {"epochs": "epochs", "max_length": "block_size"}  # full runs: option -> field
ASSETS = "generating synthetic wikitext, tokenizer and tiny GPT-2"


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings(runner.Settings):  # batches and schedule: runner.Settings
    block_size: int = 128  # tokens per training sample (the notebook's)
    prompt_tokens: int = 24  # examples: a validation block's start, and what the model adds
    # sanity threshold (beside min_loss_drop)
    max_perplexity: float = 50.0  # a ceiling
    # smoke only: the synthetic articles and the tiny GPT-2 built from a GPT2Config
    train_articles: int = 400
    dev_articles: int = 40  # validation and test each
    vocab_size: int = 600  # byte-level BPE tokens (tiny.train_byte_bpe)
    n_embd: int = 64
    layers: int = 2
    heads: int = 2
    dropout: float = 0.0


# Full run: distilgpt2 on wikitext-2-raw-v1, one epoch at the notebook's 2e-5 (it reports
# perplexity ~38 after three epochs; no GPU was lent to measure one here). Fine-tuning a
# trained LM moves its loss a little: a small loss drop suffices.
FULL = Settings(micro_batch=8, epochs=1, warmup_fraction=0.05, lr=2e-5, eval_batch=16,
                min_loss_drop=0.02, perf_key=registry.reference_key(NAME, "full"))

# Smoke thresholds, from measured runs on the 2-core CPU (bench/RESULTS.md): healthy runs
# reach perplexity ~3 (the vocabulary has 600 tokens); lr 0 stays at ~600.
SMOKE = replace(FULL, block_size=64, micro_batch=16, steps=300, warmup_steps=30, lr=3e-3,
                min_loss_drop=0.5, max_perplexity=20.0,
                perf_key=registry.reference_key(NAME, "smoke"))


# ----------------------------------------------------------------------------- assets
def write_synthetic(folder: Path, s: Settings, seed: int) -> None:
    """Synthetic wikitext: articles of " = Title = " headings and spaced sentences."""
    synthetic.save_task(folder, "wikitext", s.train_articles, s.dev_articles, seed)


def train_tokenizer(data_dir: Path, s: Settings):
    """A byte-level BPE tokenizer trained on the training lines."""
    train = runner.load_saved(data_dir, COLUMNS, SPLITS)["train"]
    return tiny.train_byte_bpe(list(train["text"]), s.vocab_size)


def tiny_model(s: Settings, tokenizer):
    """The tiny GPT-2, its one special token both the start and the end of a text."""
    from transformers import GPT2Config, GPT2LMHeadModel  # transformers: only once a run starts

    return GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tokenizer), n_positions=s.block_size, n_embd=s.n_embd,
        n_layer=s.layers, n_head=s.heads, resid_pdrop=s.dropout, embd_pdrop=s.dropout,
        attn_pdrop=s.dropout, bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id))


# ----------------------------------------------------------------------------- data
def lm_blocks(split, tokenizer, block_size: int):
    """Every line tokenized, all concatenated, cut into ``block_size`` blocks (the rest
    dropped), labels = inputs (the model shifts them): the recipe's group_texts."""
    import datasets  # datasets: only once a run starts

    ids = list(itertools.chain.from_iterable(tokenizer(list(split["text"]))["input_ids"]))
    blocks = [ids[i:i + block_size] for i in range(0, len(ids) - block_size + 1, block_size)]
    return datasets.Dataset.from_dict({"input_ids": blocks, "labels": blocks,
                                       "attention_mask": [[1] * block_size] * len(blocks)})


def prepare(data: runner.SavedData, init_model: Path, s: Settings, args) -> dict:
    """The train and validation splits as blocks, with the tokenizer that made them."""
    from transformers import AutoTokenizer  # transformers: only once a run starts

    tokenizer = AutoTokenizer.from_pretrained(init_model)
    train = lm_blocks(data.splits["train"], tokenizer, s.block_size)
    validation = lm_blocks(data.splits["validation"], tokenizer, s.block_size)
    if not len(validation):
        raise WorkloadError(f"the validation split has fewer than {s.block_size} tokens: "
                            "not one block to evaluate")
    return {"train": train, "validation": validation, "tokenizer": tokenizer,
            "info": {"source": data.source, "train_lines": len(data.splits["train"]),
                     "validation_lines": len(data.splits["validation"]),
                     "train_blocks": len(train), "validation_blocks": len(validation),
                     "block_size": s.block_size}}


def preparing(data: runner.SavedData, s: Settings) -> str:
    return (f"tokenizing {len(data.splits['train'])} + {len(data.splits['validation'])} "
            f"lines into blocks of {s.block_size}")


def samples(blocks: dict, s: Settings) -> tuple[int, str, str]:
    """The blocks a full run plans its steps over."""
    return len(blocks["train"]), f"blocks of {s.block_size} tokens", "blocks"


# ----------------------------------------------------------------------------- Trainer
def training_arguments(planned, s: Settings, rt, seed: int, output_dir: Path):
    """TrainingArguments(deepspeed=config) repeating the config's batch, learning rate,
    schedule, clipping and precision (the integration refuses values that disagree)."""
    from transformers import TrainingArguments  # transformers: only once a run starts

    config = planned.config
    optimizer = (config.get("optimizer") or {}).get("params") or {}
    return TrainingArguments(
        output_dir=str(output_dir), deepspeed=config, use_cpu=not rt.on_gpu, seed=seed,
        per_device_train_batch_size=planned.batch.micro_batch,
        gradient_accumulation_steps=planned.batch.grad_accum,
        learning_rate=planned.lr, weight_decay=optimizer.get("weight_decay", 0.0),
        max_grad_norm=config.get("gradient_clipping", 1.0),
        max_steps=s.steps, warmup_steps=s.warmup_steps, lr_scheduler_type="linear",
        bf16=bool((config.get("bf16") or {}).get("enabled")),
        fp16=bool((config.get("fp16") or {}).get("enabled")),
        per_device_eval_batch_size=s.eval_batch,
        logging_strategy="steps", logging_steps=1, save_strategy="no", eval_strategy="no",
        report_to="none", disable_tqdm=True, log_level="error", log_level_replica="error")


def step_clock(rt, steps: int):
    """A TrainerCallback that keeps each step's loss and end time, and prints progress
    lines as engine.train does."""
    from transformers import TrainerCallback  # transformers: only once a run starts

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.ends: list[float] = []
            self.begin = time.perf_counter()
            self.every = max(1, steps // 10)

        def on_train_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if rt.on_gpu:
                import torch  # torch: only once a run starts

                torch.cuda.synchronize()
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))
                step = len(self.losses)
                if rt.is_main and (step % self.every == 0 or step == steps):
                    rt.log(f"training step {step}/{steps} loss {self.losses[-1]:.4f} "
                           f"({time.perf_counter() - self.begin:.1f} s)")

        def stats(self, warmup: int, train_batch: int) -> engine.TrainStats:
            done = len(self.ends)
            warmup = min(warmup, max(done - 1, 0))
            timed_from = self.ends[warmup - 1] if warmup else self.begin
            timed = self.ends[-1] - timed_from if done else 0.0
            marks = [self.begin, *self.ends]
            return engine.TrainStats(done, warmup, self.losses, self.ends[-1] - self.begin
                                     if done else 0.0, timed,
                                     (done - warmup) * train_batch / timed if timed > 0
                                     else 0.0, train_batch,
                                     step_seconds=[round(b - a, 6) for a, b in
                                                   zip(marks, marks[1:], strict=False)])

    return StepClock()


# ----------------------------------------------------------------------------- evaluate
def continuation_rows(tokenizer, prompts: list[list[int]], generated: list[list[int]],
                      actual: list[list[int]]) -> list[dict]:
    """A validation block's start, what the model wrote next, and what the text says
    (printed, and in the report for its HTML page)."""
    rows = []
    for prompt, out, truth in zip(prompts, generated, actual, strict=True):
        new = out[len(prompt):]
        rows.append({"prompt": tokenizer.decode(prompt), "generated": tokenizer.decode(new),
                     "actual": tokenizer.decode(truth), "correct": new == truth[:len(new)]})
    return rows


def print_continuations(console, rows: list[dict]) -> None:
    """Continuations (:func:`continuation_rows`), the generated text green where it is the
    text's own."""
    from rich.table import Table  # rich: only once a run starts

    if not rows:
        return
    table = Table(title="continuations", show_lines=True, title_justify="left")
    for column in ("prompt", "generated", "actual"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(repr(row["prompt"]),
                      f"[{'green' if row['correct'] else 'red'}]{row['generated']!r}[/]",
                      repr(row["actual"]))
    console.print(table)


def continuations(ds, rt, validation, s: Settings, count: int):
    """(prompts, generated, actual) for ``count`` validation blocks: every rank takes part
    (ZeRO-3 gathers parameters collectively), greedy decoding."""
    import torch  # torch: only once a run starts

    if count <= 0:
        return [], [], []
    rows = validation.select(range(min(count, len(validation))))["input_ids"]
    cut = min(s.prompt_tokens, s.block_size // 2)
    prompts = [list(row[:cut]) for row in rows]
    inputs = {"input_ids": torch.tensor(prompts), "attention_mask": torch.ones(len(prompts), cut,
                                                                              dtype=torch.long)}
    generated = engine.generate(ds, rt, inputs, batch_size=len(prompts),
                                max_new_tokens=s.block_size - cut)
    return prompts, generated, [list(row[cut:]) for row in rows]


# ----------------------------------------------------------------------------- train
def train_and_evaluate(run: runner.Run, blocks: dict) -> int:
    """Model, Trainer, evaluation, saving, verdicts (smoke and full runs alike)."""
    # transformers: only once a run starts
    from transformers import AutoModelForCausalLM, PrinterCallback, Trainer

    args, rt, s, planned = run.args, run.rt, run.s, run.planned
    tokenizer = blocks["tokenizer"]
    trainer_dir = run.out_dir / "trainer"
    # TrainingArguments first: under ZeRO-3 from_pretrained then partitions as it loads
    training_args = training_arguments(planned, s, rt, args.seed, trainer_dir)
    model = AutoModelForCausalLM.from_pretrained(run.init_model)
    clock = step_clock(rt, s.steps)
    trainer = Trainer(model=model, args=training_args, train_dataset=blocks["train"],
                      eval_dataset=blocks["validation"], callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # our progress lines instead of raw log dicts

    # train through the Trainer's DeepSpeed engine (it builds the engine: a failed op build
    # is one line)
    with reported():
        trainer.train()
    stats = clock.stats(s.warmup_steps, planned.batch.train_batch_size)

    # evaluate: perplexity = exp(mean validation loss per token)
    loss = trainer.evaluate()["eval_loss"]
    metrics = {"perplexity": math.exp(min(loss, 700.0)), "eval_loss": loss}
    ds = trainer.model_wrapped  # the DeepSpeedEngine the integration made
    examples = continuation_rows(tokenizer, *continuations(ds, rt, blocks["validation"], s,
                                                           args.examples))

    model_dir = engine.save_model_atomically(ds, rt, run.out_dir / "model",
                                             extra=tokenizer.save_pretrained)
    if rt.is_main and trainer_dir.is_dir() and not any(trainer_dir.iterdir()):
        trainer_dir.rmdir()
    return runner.conclude(
        run, stats, metrics, data_info=blocks["info"], model_dir=model_dir,
        extra={"examples": {"kind": "continuations", "rows": examples},
               "trainer": {"integration": "transformers.Trainer, "
                                          "TrainingArguments(deepspeed=ds_config)",
                           "engine": type(ds).__name__}},
        show=lambda: print_continuations(rt.console, examples))


# ----------------------------------------------------------------------------- the run
def run(args, mode: str = "smoke") -> int:
    """``dsenv smoke gpt2-wikitext`` (synthetic wikitext, tiny GPT-2) or ``dsenv run
    gpt2-wikitext`` (distilgpt2 and wikitext-2-raw-v1 from the offline cache, or
    --data-dir)."""
    return runner.run(sys.modules[__name__], args, mode)
