"""Names one package of the training stack asks of another that the installed release of that
other lacks: torch attributes newer than the torch installed, transformers' Cache API that
remote code and older libraries still call, optimizers without accelerate's train()/eval(),
transformers classes another release does not have, PEFT config keys a newer PEFT wrote. Each
is read with the name, whose release lacks it and, where one release added it, which. Part of
the python family (python.py): its readings are the python family's."""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading

FAMILY = "python"
Q = r"[`'‘’]"

# torch attributes by the release that added them (PyTorch's release notes); a package of the
# stack calling one under an older torch. Names torch removed (torch._six) are the other
# direction, read by the catalogue's own patterns.
TORCH_SINCE = {"scaled_dot_product_attention": "2.0", "compile": "2.0", "compiler": "2.1",
               "float8_e4m3fn": "2.1", "float8_e5m2": "2.1", "float8_e4m3fnuz": "2.2",
               "float8_e5m2fnuz": "2.2", "register_pytree_node": "2.2", "device_mesh": "2.2",
               "uint16": "2.3", "uint32": "2.3", "uint64": "2.3", "GradScaler": "2.3",
               "get_default_device": "2.3", "xpu": "2.3", "is_compiling": "2.3",
               "RMSNorm": "2.4", "custom_fwd": "2.4", "custom_bwd": "2.4", "Buffer": "2.5"}
# "partially initialized module" is a circular import or a file shadowing the package instead
TORCH_NAME = re.compile(rf"(?<!partially initialized )module {Q}(?P<module>torch(?:\.nn(?:\."
                        rf"functional)?|\.utils\._pytree|\.amp|\.distributed|\.compiler)?){Q} has no "
                        rf"attribute {Q}(?P<name>{'|'.join(TORCH_SINCE)}){Q}")
# transformers' Cache classes lost get_max_length (4.49) and seen_tokens/key_cache/value_cache
# (4.56): model code under transformers_modules or an older library still calls them
CACHE_API = re.compile(rf"{Q}(?P<object>\w*Cache){Q} object has no attribute {Q}(?P<name>"
                       rf"get_max_length|_?seen_tokens|key_cache|value_cache|get_usable_length)"
                       rf"{Q}")
# transformers >= 4.45 calls optimizer.train()/eval(), which accelerate's wrapper has from 0.34
OPTIMIZER_TRAIN = re.compile(rf"{Q}(?P<object>\w*(?:Adam|SGD|Adafactor|Lion|Optimizer)\w*){Q} "
                             rf"object has no attribute {Q}(?P<name>train|eval){Q}")
# a transformers class by attribute (diffusers' loader, `transformers.X`), either direction
TRANSFORMERS_CLASS = re.compile(rf"(?<!partially initialized )module {Q}?transformers{Q}? has no "
                                rf"attribute {Q}?(?P<name>[A-Z]\w+)")
# adapter_config.json written by a newer PEFT: keys older PEFTs' config classes refuse (PEFT
# >= 0.14 ignores unknown keys, huggingface/peft PR 2038)
PEFT_KEY = re.compile(r"\b(?P<object>(?:Lora|LoHa|LoKr|AdaLora|IA3|Prefix\w*|Prompt\w*|Peft|Boft"
                      r"|Oft|Vera)Config)\.__init__\(\) got an unexpected keyword argument "
                      rf"{Q}(?P<name>\w+){Q}")

# huggingface_hub's own functions refusing a keyword (every public one is wrapped by its
# validators' _inner_fn): the keyword's release, from the wheels' signatures (0.8.1 ... 1.0.0).
# The huggingface family reads it (its mode is the hub's version, hf.hub-version-api-removed).
HUB_KWARG = re.compile(r"\b(?P<fn>hf_hub_download|snapshot_download|cached_download|hf_hub_url|"
                       r"upload_file|upload_folder|create_repo)\(\) got an unexpected keyword "
                       r"argument [`'‘’](?P<kw>\w+)")
HUB_KWARG_RELEASE = {"allow_patterns": "added in 0.9", "ignore_patterns": "added in 0.9",
                     "token": "added in 0.11", "local_dir": "added in 0.13",
                     "local_dir_use_symlinks": "added in 0.13", "allow_regex": "removed in 0.12",
                     "ignore_regex": "removed in 0.12", "use_auth_token": "refused from 1.0"}

# transformers names by the release that removed or added them (read from its wheels, 4.38.2
# to 4.52.0): which way "cannot import name X from transformers" points.
TRANSFORMERS_NAMES = {"top_k_top_p_filtering": "removed in 4.39",
                      "shard_checkpoint": "removed in 4.47",
                      "is_torch_tpu_available": "removed in 4.51",
                      "is_torch_xla_available": "added in 4.39",
                      "EncoderDecoderCache": "added in 4.43"}


def transformers_change(module: str, name: str) -> dict[str, str]:
    """Which way a transformers name missing at import points, where its release is known (the
    build family reads the import: "cannot import name X from transformers")."""
    change = TRANSFORMERS_NAMES.get(name, "") if module.startswith("transformers") else ""
    if not change:
        return {}
    release = change.split()[-1]
    return {"transformers": change, "direction": (
        f"the importer is older than the installed transformers: upgrade it, or pin transformers"
        f"<{release}" if change.startswith("removed") else
        f"the installed transformers is older: upgrade it to >= {release}")}

# pydantic 2 removed the v1 API a package of the v1 era calls (DeepSpeed <= 0.10.0's config
# classes among them); the v2-only names a newer package imports from a pydantic 1
PYDANTIC_V1_API = re.compile(rf"{Q}FieldInfo{Q} object has no attribute {Q}(?P<name>required|"
                             rf"field_info|allow_mutation|outer_type_){Q}|If you use {Q}@root_"
                             rf"validator{Q} with pre=False|{Q}(?P<moved>BaseSettings){Q} has been "
                             rf"moved to the {Q}pydantic-settings{Q} package")
PYDANTIC_V2_NAME = re.compile(rf"cannot import name {Q}(?P<name>field_validator|model_validator|"
                              rf"field_serializer|model_serializer|ConfigDict|computed_field|"
                              rf"TypeAdapter|RootModel){Q} from {Q}pydantic(?![\w.])")

# Storage packages released in lockstep: s3fs/gcsfs/adlfs pin one fsspec release (a name or
# submodule the installed fsspec lacks), datasets' pickler patches dill's internals (a dill
# newer or older than the datasets release allows), s3fs pins aiobotocore, which pins botocore.
STORAGE_PAIR = re.compile(rf"cannot import name {Q}(?P<name>\w+){Q} from {Q}(?P<fsspec>fsspec(?:\.\w+)*)"
                          rf"{Q}|No module named {Q}(?P<fsmod>fsspec\.\w+){Q}"
                          # Python < 3.8 names no module: the import statement above does
                          rf"|from (?P<fsfrom>fsspec(?:\.\w+)*) import [^\n]*\n\s*ImportError: "
                          rf"cannot import name {Q}(?P<fsname>\w+){Q}"
                          rf"|module {Q}(?P<dill>dill(?:\._dill)?){Q} has no attribute {Q}(?P<dname>\w+){Q}"
                          rf"|{Q}(?P<aio>AioClientCreator){Q} object has no attribute {Q}(?P<aname>\w+){Q}"
                          rf"|module {Q}(?P<aiomod>aiobotocore){Q} has no attribute {Q}(?P<amname>\w+){Q}")
PAIRED = {"fsspec": "fsspec and s3fs/gcsfs/adlfs (each release pins one fsspec release)",
          "dill": "dill and datasets (datasets' pickler patches dill's internals)",
          "aiobotocore": "aiobotocore, botocore and s3fs (each pins the next)"}


# DeepSpeed's config classes (a pasted path may be cut: its function names it too)
DS_CONFIG = re.compile(r"deepspeed[/\\]runtime[/\\]config_utils\.py|config_utils\.py\"?, line "
                       r"\d+, in _deprecated_fields_check")


def _pydantic(message: str) -> list[Reading]:
    if m := PYDANTIC_V1_API.search(message):
        name = m["name"] or m["moved"] or "root_validator"
        return [reading(FAMILY, "env.package-older-than-pydantic-2", m.group(0), v1_api=name,
                        installed="pydantic 2", caller="deepspeed" if DS_CONFIG.search(message)
                        else "")]
    if m := PYDANTIC_V2_NAME.search(message):
        return [reading(FAMILY, "env.pydantic-older-than-package", m.group(0),
                        v2_name=m["name"], installed="pydantic 1")]
    return []


def api_readings(message: str) -> list[Reading]:
    found = []

    def add(match: re.Match, **parts: str) -> None:
        found.append(reading(FAMILY, "env.package-version-mismatch", match.group(0), **parts))

    if m := TORCH_NAME.search(message):
        add(m, missing=f"{m['module']}.{m['name']}", needs=f"torch >= {TORCH_SINCE[m['name']]}")
    if m := CACHE_API.search(message):
        caller = "the model's remote code" if "transformers_modules" in message else ""
        add(m, missing=f"{m['object']}.{m['name']}", release_lacking_it="transformers (>= 4.49 "
            "removed get_max_length, >= 4.56 seen_tokens/key_cache/value_cache)",
            **({"caller": caller} if caller else {}))
    if m := OPTIMIZER_TRAIN.search(message):
        add(m, missing=f"{m['object']}.{m['name']}()", needs="accelerate >= 0.34 (transformers "
            ">= 4.45 calls it)")
    if m := TRANSFORMERS_CLASS.search(message):
        add(m, missing=f"transformers.{m['name']}")
    if m := PEFT_KEY.search(message):
        add(m, missing=f"{m['object']}({m['name']}=...)", written_by="a newer peft (the "
            "adapter's adapter_config.json)")
    if m := STORAGE_PAIR.search(message):
        pkg = ("fsspec" if m["fsspec"] or m["fsmod"] or m["fsfrom"] else "dill" if m["dill"] else "aiobotocore")
        missing = (f"{m['fsspec']}.{m['name']}" if m["fsspec"] else m["fsmod"] if m["fsmod"]
                   else f"{m['fsfrom']}.{m['fsname']}" if m["fsfrom"]
                   else f"{m['dill']}.{m['dname']}" if m["dill"]
                   else f"AioClientCreator.{m['aname']}" if m["aio"]
                   else f"aiobotocore.{m['amname']}")
        add(m, missing=missing, releases_that_go_together=PAIRED[pkg])
    return found + _pydantic(message)
