"""The `tabloop` command: one entry point over the server, the index, the backend and the
evaluations (`tabloop.cli`). It sits on top of every other package and nothing imports it."""
