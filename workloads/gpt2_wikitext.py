"""gpt2-wikitext: a GPT-2 causal language model on wikitext-2-raw-v1, through the
transformers Trainer (seed 003, HPC5).

Seed 003 trains through ``Trainer`` with ``TrainingArguments(deepspeed=ds_config)``, the
transformers integration, not the DeepSpeed engine directly; so does this workload, with
the config dsenv plans (preset, derived batch, learning rate, schedule), whose values the
TrainingArguments repeat so that the integration's consistency check passes. The data set
is read with ``load_from_disk`` from a folder ``save_to_disk`` wrote, as the seed does on
its compute nodes: `dsenv fetch gpt2-wikitext` writes the real one, the smoke writes a
synthetic one in its layout (a ``text`` column of wikitext lines: " = Title = " headings,
blank lines, spaced punctuation). Lines are tokenized, concatenated and cut into blocks
(the recipe's ``group_texts``); the metric is perplexity, exp of the validation loss.

The smoke (``dsenv smoke gpt2-wikitext``) needs nothing from the network: a tiny GPT-2
from a GPT2Config and a byte-level BPE tokenizer trained here. The full run (``dsenv run
gpt2-wikitext``) fine-tunes distilgpt2 with the seed's learning rate (2e-5), one epoch.

Reads top to bottom: settings, assets, data, runs (model, train, evaluate, report).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

from dsenv.workloads import assets, dsconfig, engine, runner, synthetic
from dsenv.workloads.launch_env import WorkloadError

from dsenv.staging import staged_dir

NAME = "gpt2-wikitext"
COLUMNS = ("text",)
SPLITS = ("train", "validation")
THRESHOLDS = ("min_loss_drop", "max_perplexity")  # Settings fields
PACKAGES = {"accelerate": "accelerate"}  # module -> distribution, beyond torch/transformers
OTHER_OPTIONS = {"no_sync_gradients": "--no-sync-gradients", "doc_stride": "--doc-stride",
                 "model_dir": "--model-dir"}


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings:
    block_size: int = 128  # tokens per training sample (the recipe seed 003 follows)
    micro_batch: int = 8
    steps: int = 0  # 0: epochs
    epochs: int = 1  # seed 003
    warmup_steps: int = 0
    warmup_fraction: float = 0.05
    lr: float = 2e-5  # seed 003
    eval_batch: int = 16
    prompt_tokens: int = 24  # examples: a validation block's start, and what the model adds
    # sanity thresholds
    min_loss_drop: float = 0.02  # fine-tuning a trained LM moves its loss a little
    max_perplexity: float = 50.0
    perf_key: str = "gpt2-wikitext-full"
    # smoke only: the synthetic articles and the tiny GPT-2 built from a GPT2Config
    train_articles: int = 400
    dev_articles: int = 40
    vocab_size: int = 600
    n_embd: int = 64
    layers: int = 2
    heads: int = 2
    dropout: float = 0.0


# Full run: distilgpt2 on wikitext-2-raw-v1, one epoch at seed 003's 2e-5 (the recipe it
# follows reports perplexity ~38 after three epochs; no GPU was lent to measure one here).
FULL = Settings()

# Smoke thresholds, from measured runs on the 2-core CPU (bench/RESULTS.md): healthy runs
# reach perplexity ~3 (the vocabulary has 600 tokens); lr 0 stays at ~600.
SMOKE = replace(FULL, block_size=64, micro_batch=16, steps=300, warmup_steps=30, lr=3e-3,
                min_loss_drop=0.5, max_perplexity=20.0, perf_key="gpt2-wikitext-smoke")


# ----------------------------------------------------------------------------- assets
def make_smoke_assets(root: Path, s: Settings, seed: int, user_data: Path | None) -> None:
    """Rank 0: synthetic wikitext splits (unless ``user_data``), a byte-level BPE tokenizer
    trained on the training lines, and the initial tiny GPT-2, all saved to disk."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if user_data is None:
        synthetic.save_splits(root / "data", "wikitext", {
            "train": synthetic.wikitext_rows(s.train_articles, seed),
            "validation": synthetic.wikitext_rows(s.dev_articles, seed + 7919),
            "test": synthetic.wikitext_rows(s.dev_articles, seed + 15838)})
    train = runner.load_saved(user_data or root / "data", COLUMNS, SPLITS)["train"]
    tokenizer = runner.train_byte_bpe(list(train["text"]), s.vocab_size)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=s.block_size, n_embd=s.n_embd,
                        n_layer=s.layers, n_head=s.heads, resid_pdrop=s.dropout,
                        embd_pdrop=s.dropout, attn_pdrop=s.dropout,
                        bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    with staged_dir(root / "init-model") as tmp:
        GPT2LMHeadModel(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


# ----------------------------------------------------------------------------- data
def read_data(args, mode: str, generated: Path | None):
    """(DatasetDict, where from): --data-dir, the smoke's generated folder, or the cache."""
    if args.data_dir:
        return runner.load_saved(Path(args.data_dir), COLUMNS, SPLITS), str(args.data_dir)
    if mode == "smoke":
        return runner.load_saved(generated, COLUMNS, SPLITS), str(generated)
    return runner.cached_splits(NAME, COLUMNS, SPLITS)


def lm_blocks(split, tokenizer, block_size: int):
    """Every line tokenized, all concatenated, cut into ``block_size`` blocks (the rest
    dropped), labels = inputs (the model shifts them): the recipe's group_texts."""
    import datasets

    ids = list(itertools.chain.from_iterable(tokenizer(list(split["text"]))["input_ids"]))
    blocks = [ids[i:i + block_size] for i in range(0, len(ids) - block_size + 1, block_size)]
    return datasets.Dataset.from_dict({"input_ids": blocks, "labels": blocks,
                                       "attention_mask": [[1] * block_size] * len(blocks)})


# ----------------------------------------------------------------------------- Trainer
def training_arguments(planned, s: Settings, rt, seed: int, output_dir: Path):
    """TrainingArguments(deepspeed=config) repeating the config's batch, learning rate,
    schedule, clipping and precision (the integration refuses values that disagree)."""
    from transformers import TrainingArguments

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
    from transformers import TrainerCallback

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
                import torch

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
            return engine.TrainStats(done, warmup, self.losses, self.ends[-1] - self.begin
                                     if done else 0.0, timed,
                                     (done - warmup) * train_batch / timed if timed > 0
                                     else 0.0, train_batch)

    return StepClock()


# ----------------------------------------------------------------------------- evaluate
def print_continuations(console, tokenizer, prompts: list[list[int]], generated: list[list[int]],
                        actual: list[list[int]]) -> None:
    """A validation block's start, what the model wrote next, and what the text says."""
    from rich.table import Table

    if not prompts:
        return
    table = Table(title="continuations", show_lines=True, title_justify="left")
    for column in ("prompt", "generated", "actual"):
        table.add_column(column, overflow="fold")
    for prompt, out, truth in zip(prompts, generated, actual, strict=True):
        new = out[len(prompt):]
        same = new == truth[:len(new)]
        table.add_row(repr(tokenizer.decode(prompt)),
                      f"[{'green' if same else 'red'}]{tokenizer.decode(new)!r}[/]",
                      repr(tokenizer.decode(truth)))
    console.print(table)


# ----------------------------------------------------------------------------- runs
def run(args, mode: str = "smoke") -> int:
    return run_smoke(args) if mode == "smoke" else run_full(args)


def run_smoke(args) -> int:
    """Synthetic wikitext, tokenizer and tiny GPT-2 made here; everything else as a full
    run."""
    wall_start = time.perf_counter()
    s = runner.smoke_settings(args, SMOKE)
    out_dir = Path(args.output_dir).resolve()
    runner.reject_options(args, NAME, OTHER_OPTIONS)
    runner.require(NAME, PACKAGES)
    dsconfig.check_inputs(args.preset, args.deepspeed_config)
    user_data = runner.checked_user_data(args, COLUMNS, SPLITS)
    rt, planned, timings = runner.begin_smoke(args, NAME, s)
    smoke_assets = out_dir / "assets"
    runner.on_main(rt, "generating synthetic wikitext, tokenizer and tiny GPT-2",
                   lambda: make_smoke_assets(smoke_assets, s, args.seed, user_data))
    init_model = smoke_assets / "init-model"
    data, source = read_data(args, "smoke", smoke_assets / "data")
    blocks = make_blocks(data, init_model, s)
    return train_evaluate_report(args, "smoke", rt, s, planned, timings, init_model, blocks,
                                 {"source": source, **blocks["info"]}, wall_start)


def run_full(args) -> int:
    """distilgpt2 and wikitext-2-raw-v1 from the offline cache (or --data-dir)."""
    wall_start = time.perf_counter()
    assets.force_offline()
    s = replace(FULL, **{key: value for key, value in (
        ("epochs", args.epochs), ("block_size", args.max_length)) if value})
    runner.reject_options(args, NAME, OTHER_OPTIONS)
    runner.require(NAME, PACKAGES)
    dsconfig.check_inputs(args.preset, args.deepspeed_config)
    init_model = assets.model_path(NAME)  # every input checked before an engine starts
    data, source = read_data(args, "run", None)
    data = runner.capped(data, args)

    rt = engine.start()
    runner.quiet_transformers()
    with rt.console.status(f"tokenizing {len(data['train'])} + {len(data['validation'])} "
                           f"lines into blocks of {s.block_size}"):
        blocks = make_blocks(data, init_model, s)
    planned = runner.plan(args, rt, s, scheduled=False)
    steps, warmup = runner.planned_steps(s, len(blocks["train"]), planned.batch.micro_batch,
                                         planned.batch.grad_accum, rt.world_size,
                                         args.max_steps, f"blocks of {s.block_size} tokens")
    s = replace(s, steps=steps, warmup_steps=warmup)
    planned = dsconfig.with_schedule(planned, warmup, steps)
    timings = runner.launch(args, rt, NAME, "run", planned, f"{steps} steps ({s.epochs} epochs"
                            f"{', capped by --max-steps' if args.max_steps else ''}) over "
                            f"{len(blocks['train'])} blocks")
    return train_evaluate_report(args, "run", rt, s, planned, timings, init_model, blocks,
                                 {"source": source, **blocks["info"]}, wall_start)


def make_blocks(data, init_model: Path, s: Settings) -> dict:
    """The train and validation splits as blocks, with the tokenizer that made them."""
    from transformers import AutoTokenizer

    runner.quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(init_model)
    train = lm_blocks(data["train"], tokenizer, s.block_size)
    validation = lm_blocks(data["validation"], tokenizer, s.block_size)
    if not len(validation):
        raise WorkloadError(f"the validation split has fewer than {s.block_size} tokens: "
                                   "not one block to evaluate")
    return {"train": train, "validation": validation, "tokenizer": tokenizer,
            "info": {"train_lines": len(data["train"]),
                     "validation_lines": len(data["validation"]),
                     "train_blocks": len(train), "validation_blocks": len(validation),
                     "block_size": s.block_size}}


def train_evaluate_report(args, mode: str, rt, s: Settings, planned, timings: dict,
                          init_model: Path, blocks: dict, data_info: dict,
                          wall_start: float) -> int:
    """What smoke and full runs share: model, Trainer, evaluation, saving, verdicts."""
    from transformers import AutoModelForCausalLM, PrinterCallback, Trainer

    out_dir = Path(args.output_dir).resolve()
    tokenizer = blocks["tokenizer"]
    trainer_dir = out_dir / "trainer"
    # TrainingArguments first: under ZeRO-3 from_pretrained then partitions as it loads
    training_args = training_arguments(planned, s, rt, args.seed, trainer_dir)
    model = AutoModelForCausalLM.from_pretrained(init_model)
    clock = step_clock(rt, s.steps)
    trainer = Trainer(model=model, args=training_args, train_dataset=blocks["train"],
                      eval_dataset=blocks["validation"], callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # our progress lines instead of raw log dicts

    # train through the Trainer's DeepSpeed engine
    trainer.train()
    stats = clock.stats(s.warmup_steps, planned.batch.train_batch_size)

    # evaluate: perplexity = exp(mean validation loss per token)
    loss = trainer.evaluate()["eval_loss"]
    metrics = {"perplexity": math.exp(min(loss, 700.0)), "eval_loss": loss}
    ds = trainer.model_wrapped  # the DeepSpeedEngine the integration made
    prompts, generated, actual = continuations(ds, rt, blocks["validation"], s, args.examples)

    model_dir = engine.save_model_atomically(ds, rt, out_dir / "model",
                                             extra=tokenizer.save_pretrained)
    if rt.is_main and trainer_dir.is_dir() and not any(trainer_dir.iterdir()):
        trainer_dir.rmdir()
    return runner.conclude(
        args, NAME, mode, rt, s, planned, timings, stats, metrics,
        runner.thresholds(s, THRESHOLDS), init_model=init_model, data_info=data_info,
        wall_start=wall_start, model_dir=model_dir,
        extra={"trainer": {"integration": "transformers.Trainer, "
                                          "TrainingArguments(deepspeed=ds_config)",
                           "engine": type(ds).__name__}},
        show=lambda: print_continuations(rt.console, tokenizer, prompts, generated, actual))


def continuations(ds, rt, validation, s: Settings, count: int):
    """(prompts, generated, actual) for ``count`` validation blocks: every rank takes part
    (ZeRO-3 gathers parameters collectively), greedy decoding."""
    import torch

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
