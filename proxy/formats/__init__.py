"""The wire formats the proxy compacts, one folder each: how a format's requests and answers map onto the pipeline."""
