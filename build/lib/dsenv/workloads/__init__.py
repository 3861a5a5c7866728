"""Bundled workloads: bert-squad, t5-xsum, gpt2-wikitext, bert-mrpc."""
