-- Records the `initialize` params Neovim sends to a language server.
-- Usage: nvim --headless --clean -l neovim.lua PYTHON OUT.json
local python, out = arg[1], arg[2]
local here = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2))
local root = vim.fs.normalize(vim.fn.tempname())
vim.fn.mkdir(root, 'p')
vim.cmd.edit(vim.fs.joinpath(root, 'main.py'))

local client_id = vim.lsp.start({
  name = 'tabloop',
  cmd = { python, vim.fs.joinpath(here, 'record_server.py'), out },
  root_dir = root,
  init_options = { telemetry = { clientEnabled = false } },
})
assert(client_id, 'client did not start')
local ok = vim.wait(10000, function()
  local client = vim.lsp.get_client_by_id(client_id)
  return client ~= nil and client.initialized == true
end, 20)
assert(ok, 'server did not initialize within 10 s')
vim.lsp.get_client_by_id(client_id):stop()
vim.wait(5000, function() return vim.lsp.get_client_by_id(client_id) == nil end, 20)
io.stdout:write('recorded ', out, '\n')
