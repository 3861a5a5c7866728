"""The failure catalogue's tables, one TOML file per family (build, gpu, comm, launch, mpi,
loader, huggingface, rocm, container, system). doctor/catalogue.py reads them all.

Fields of each ``[[mode]]``:

- id: ``area.name``, unique over all files; area: one of catalogue.AREAS;
- title; symptom: as users see it (exact error text where there is one);
- match: Python regexes (case-insensitive, multiline) searched in a failure's message;
- also / against (optional): more message evidence for the mode (weight 3) and evidence that
  the same symptom came from elsewhere (weight -3), read by doctor/explain/rank.py;
- goes_on (optional, default false): the process goes on after this symptom (NCCL falls back
  to sockets, a notice): in a log, a later line that names a cause it dies of is the root;
- merged (optional): ids of earlier or proposed modes of the same cause this one took in
  (`dsenv explain ID` prints this mode; bench/explain_corpus.py counts a label of that id as it);
- cause; detect: how it is detected before the job, or "cannot: why";
- check: the doctor check id that catches it ("" when none can, before launch);
- fix: one concrete fix; fixable: "" or a doctor/fix/actions.py KIND `--fix` can apply;
- sources: public URLs (GitHub issues as https://github.com/OWNER/REPO/issues/N).

Every mode has at least two verbatim symptoms from different public reports in
tests/fixtures/explain_symptoms/<file>.jsonl; tests/test_explain_catalogue.py holds it to it.
"""
