"""Self-contained HTML reports: the page (:mod:`.page`: escaping, tables, the document) and
its plots (:mod:`.svg`: line charts and heat maps drawn as inline SVG). The workloads' and
the doctor's pages build on these; nothing here knows a report's fields."""
