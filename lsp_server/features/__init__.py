"""LSP features; each module has `register(server)`."""
