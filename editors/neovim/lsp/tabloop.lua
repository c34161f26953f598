-- tabloop language server: AI inline completion that learns when to speak.
-- Neovim 0.11+: `vim.lsp.enable('tabloop')`; override any field with `vim.lsp.config('tabloop', {...})`
-- or `require('tabloop').setup({...})`.

local protocol = require('tabloop.protocol')

local ROOT_MARKERS = { 'tabloop.toml', 'pyproject.toml', 'package.json', 'Cargo.toml', 'go.mod', '.git' }

--- The server command: `tabloop` on PATH, else the active Python environment's `python -m lsp_server`.
local function default_cmd()
  if vim.fn.executable('tabloop') == 1 then
    return { 'tabloop', 'serve', '--stdio' }
  end
  local venv = vim.env.VIRTUAL_ENV
  local python = venv and vim.fs.joinpath(venv, 'bin', 'python') or 'python3'
  return { python, '-m', 'lsp_server', '--stdio' }
end

---@type vim.lsp.Config
return {
  cmd = default_cmd(),
  -- No `filetypes`: suggestions are useful in every file the user edits.
  root_markers = ROOT_MARKERS,
  --- Files only (not scratch buffers or `scheme://` buffers, which would start a server and load a
  --- model for nothing); the project root, else the file's directory.
  root_dir = function(bufnr, on_dir)
    local name = vim.api.nvim_buf_get_name(bufnr)
    if name == '' or name:match('^%a[%w+.-]*://') then
      return
    end
    on_dir(vim.fs.root(bufnr, ROOT_MARKERS) or vim.fs.dirname(name))
  end,
  -- The server layers these over `tabloop.toml` and the user's config.toml; the same object is
  -- answered for `workspace/configuration` (section `tabloop`).
  init_options = {},
  settings = { [protocol.CONFIGURATION_SECTION] = {} },
  on_attach = function(client, bufnr)
    require('tabloop').attach(client, bufnr)
  end,
}
