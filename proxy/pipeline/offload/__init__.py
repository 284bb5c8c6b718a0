"""Offloaded tool results in the proxy: kept in the state store, read back by the model through the proxy's tool."""
