"""Model FLOPs per sample, and a run's efficiency against its device's peak (no torch here).

    efficiency = model FLOPs per sample x samples/s per device / the device's dense peak
                 for the run's precision (envs/device_peaks.toml)

Model FLOPs per training sample, forward and backward, counted as the PaLM paper does
(Chowdhery et al. 2022, arXiv:2204.02311, appendix B: 6N + 12LHQT per token) and as the
Megatron-LM paper's closed form gives for GPT/BERT layers (Narayanan et al. 2021,
arXiv:2104.04473, section 5.1, without recomputation: 72 B s l h^2 (1 + s/6h)):

    FLOPs/sample = 6 x N x T  +  12 x L x d_attn x T^2

N: the parameters every token passes through (all but the embedding tables, which are
lookups; with the output projection when the model ties it to the embedding, as GPT-2 and
T5 do; without heads applied once per sequence, BERT's pooler and classifier). T: tokens
per sample at their padded length, what the device computes. 6 = 2 FLOPs per multiply-add
x (forward + backward's two products). The attention term is the two T x T products
(QK^T, AV) of each layer, d_attn = heads x head size. An encoder-decoder (T5) counts its
encoder (and the decoder's cross-attention keys and values) over the source tokens, the
rest of its decoder and the output projection over the target tokens, and cross-attention's
products as 12 x L_dec x d_attn x T_dec x T_enc.

The model is read from the config.json the run loaded (no torch), the lengths from the
workload's settings. A model type, a device or a precision without a figure gives
efficiency "not known" with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dsenv.envs import peaks

FORMULA = ("6 x N x T + 12 x L x d_attn x T^2 per sample (PaLM, arXiv:2204.02311, appendix "
           "B; Megatron-LM, arXiv:2104.04473, section 5.1)")
# BERT architectures with the pooler (a dense layer on [CLS]: once per sequence)
POOLED = ("BertModel", "BertForSequenceClassification", "BertForPreTraining",
          "BertForNextSentencePrediction", "BertForMultipleChoice")


@dataclass(frozen=True)
class ModelFlops:
    model_type: str
    parameters: int  # all of the model's parameters
    token_parameters: int  # N: those every token passes through (encoder + decoder: both)
    layers: int
    hidden: int
    tokens: dict  # {"tokens": T} or {"encoder": T_enc, "decoder": T_dec}
    flops_per_sample: float

    def as_dict(self) -> dict:
        return {"type": self.model_type, "parameters": self.parameters,
                "token_parameters": self.token_parameters, "layers": self.layers,
                "hidden": self.hidden, "tokens_per_sample": self.tokens,
                "flops_per_sample": self.flops_per_sample}


# ----------------------------------------------------------------------------- models
def bert_flops(c: dict, tokens: int) -> ModelFlops:
    h, layers, ff = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
    layer = 4 * (h * h + h) + (h * ff + ff) + (ff * h + h) + 2 * 2 * h  # attention, FFN, 2 LN
    embeddings = (c["vocab_size"] + c.get("max_position_embeddings", 512)
                  + c.get("type_vocab_size", 2)) * h
    arch = (c.get("architectures") or ["BertModel"])[0]
    pooler = h * h + h if arch in POOLED else 0
    labels = len(c.get("id2label") or {}) or c.get("num_labels", 2)
    per_token_head = 2 * h + 2 if arch == "BertForQuestionAnswering" else 0  # start/end
    per_sequence_head = labels * h + labels if arch == "BertForSequenceClassification" else 0
    n = layers * layer + per_token_head
    total = embeddings + 2 * h + n + pooler + per_sequence_head
    flops = 6 * n * tokens + 12 * layers * h * tokens ** 2
    return ModelFlops("bert", total, n, layers, h, {"tokens": tokens}, float(flops))


def gpt2_flops(c: dict, tokens: int) -> ModelFlops:
    h, layers = c["n_embd"], c["n_layer"]
    inner = c.get("n_inner") or 4 * h
    layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * inner + inner) + (inner * h + h) + 2 * 2 * h
    lm_head = c["vocab_size"] * h  # tied to the token embedding: a matmul over every token
    n = layers * layer + 2 * h + lm_head
    total = n + c.get("n_positions", 1024) * h
    flops = 6 * n * tokens + 12 * layers * h * tokens ** 2
    return ModelFlops("gpt2", total, n, layers, h, {"tokens": tokens}, float(flops))


def t5_flops(c: dict, source: int, target: int) -> ModelFlops:
    d, ff, heads = c["d_model"], c["d_ff"], c["num_heads"]
    inner = heads * c["d_kv"]
    enc_layers = c["num_layers"]
    dec_layers = c.get("num_decoder_layers") or enc_layers
    gated = str(c.get("feed_forward_proj", "relu")).startswith("gated")
    attention = 4 * d * inner + d  # q, k, v, o (no biases) and its layer norm
    ffn = (3 if gated else 2) * d * ff + d
    encoder = enc_layers * (attention + ffn) + d  # + final layer norm
    lm_head = c["vocab_size"] * d  # tied or not, a matmul over every target token
    cross_kv = dec_layers * 2 * d * inner  # cross-attention keys and values: source tokens
    decoder = dec_layers * (2 * attention + ffn) + d + lm_head
    tied = c.get("tie_word_embeddings", True)
    buckets = c.get("relative_attention_num_buckets", 32) * heads * 2  # lookups
    total = encoder + decoder - lm_head * tied + c["vocab_size"] * d + buckets
    flops = (6 * (encoder * source + (decoder - cross_kv) * target + cross_kv * source)
             + 12 * inner * (enc_layers * source ** 2 + dec_layers * target ** 2
                             + dec_layers * target * source))
    return ModelFlops("t5", total, encoder + decoder, enc_layers + dec_layers, d,
                      {"encoder": source, "decoder": target}, float(flops))


def model_flops(config: dict, lengths: dict) -> ModelFlops:
    """``config``: a transformers config.json; ``lengths``: :func:`sequence_lengths`."""
    kind = config.get("model_type")
    if kind == "bert":
        return bert_flops(config, lengths["tokens"])
    if kind == "gpt2":
        return gpt2_flops(config, lengths["tokens"])
    if kind == "t5":
        return t5_flops(config, lengths["encoder"], lengths["decoder"])
    raise ValueError(f"no FLOPs formula for model type {kind!r} (dsenv counts bert, gpt2, t5)")


def sequence_lengths(settings) -> dict:
    """A workload's padded tokens per sample: T5's source and target, GPT-2's block, or a
    BERT workload's window."""
    if hasattr(settings, "max_source_length"):
        return {"encoder": settings.max_source_length, "decoder": settings.max_target_length}
    if hasattr(settings, "block_size"):
        return {"tokens": settings.block_size}
    return {"tokens": settings.max_length}


# ----------------------------------------------------------------------------- precision
def run_precision(ds_config: dict, tf32: bool = False) -> str:
    """The matrix math a DeepSpeed config trains in: bf16 or fp16 (mixed precision or
    torch_autocast), else fp32, or tf32 where torch lets fp32 matmuls use tensor cores."""
    def enabled(key: str) -> bool:
        return bool((ds_config.get(key) or {}).get("enabled"))

    if enabled("bf16") or enabled("bfloat16"):
        return "bf16"
    if enabled("fp16"):
        return "fp16"
    if enabled("torch_autocast"):
        dtype = str(ds_config["torch_autocast"].get("dtype", "bfloat16"))
        return "fp16" if "16" in dtype and "bf" not in dtype else "bf16"
    return "tf32" if tf32 else "fp32"


def torch_allows_tf32() -> bool:
    import torch  # torch: only once a run has started

    return torch.get_float32_matmul_precision() != "highest"


# ----------------------------------------------------------------------------- efficiency
def efficiency(flops: ModelFlops | None, samples_per_s_per_device: float, device_type: str,
               precision: str, unknown_model: str = "") -> dict:
    """The report's ``training.efficiency``: known (a fraction of peak) or not known, why."""
    doc = {"status": "not known", "value": None, "reason": None, "precision": precision,
           "device": device_type, "samples_per_s_per_device": samples_per_s_per_device,
           "flops_per_sample": flops.flops_per_sample if flops else None,
           "model_tflops_per_device": None, "peak": None, "formula": FORMULA,
           "model": flops.as_dict() if flops else None}
    if flops is None:
        return doc | {"reason": f"model FLOPs not known: {unknown_model}"}
    achieved = flops.flops_per_sample * samples_per_s_per_device / 1e12
    doc["model_tflops_per_device"] = achieved
    peak = peaks.peak(device_type, precision)
    if isinstance(peak, peaks.PeakUnknown):
        return doc | {"reason": peak.reason}
    return doc | {"status": "known", "value": achieved / peak.tflops, "peak": peak.as_dict()}


def for_run(model_dir: Path, settings, ds_config: dict, device_type: str,
            samples_per_s_per_device: float, tf32: bool = False) -> dict:
    """Efficiency of a run: the model's config.json in ``model_dir`` (the one it loaded)."""
    precision = run_precision(ds_config, tf32)
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        flops = model_flops(config, sequence_lengths(settings))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return efficiency(None, samples_per_s_per_device, device_type, precision,
                          f"{type(exc).__name__}: {exc}" if isinstance(exc, KeyError) else
                          str(exc))
    return efficiency(flops, samples_per_s_per_device, device_type, precision)


def describe(eff: dict) -> str:
    """The summary's efficiency row: '12.1% of the NVIDIA H200 SXM bf16 peak (...)', or
    'not known: <reason> (...)'."""
    flops = eff.get("flops_per_sample")
    work = (f"{_si(flops)}FLOP/sample x {eff['samples_per_s_per_device']:.1f}/s = "
            f"{_si(eff['model_tflops_per_device'] * 1e12)}FLOP/s per device" if flops else "")
    if eff["status"] != "known":
        return f"not known: {eff['reason']}" + (f" ({work})" if work else "")
    peak = eff["peak"]
    return (f"{eff['value']:.1%} of the {peak['model']} {peak['precision']} peak ({work}; "
            f"peak {peak['tflops']:g} TFLOP/s)")


def _si(value: float) -> str:
    """212e9 -> '212 G', 1.44e7 -> '14.4 M'."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.3g} "
