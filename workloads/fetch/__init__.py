"""dsenv fetch: assets for offline nodes, from the Hub or a bundle, with a manifest."""
