--- tabloop for Neovim: ghost-text suggestions and next edits from the tabloop language server,
--- codebase search by meaning, and status. `lsp/tabloop.lua` is the server config; this module is
--- what runs when the server attaches to a buffer.
local config = require('tabloop.config')
local inline = require('tabloop.inline')
local next_edit = require('tabloop.next_edit')
local protocol = require('tabloop.protocol')

local M = {}

--- Configure the plugin (all fields optional; see `:help tabloop`).
---@param opts? tabloop.Options|table
function M.setup(opts)
  config.options = vim.tbl_deep_extend('force', vim.deepcopy(config.defaults), opts or {})
  if opts and opts.keymaps then
    -- `false` switches a key off; tbl_deep_extend keeps it as given.
    config.options.keymaps = vim.tbl_extend('force', config.defaults.keymaps, opts.keymaps)
  end
  local settings = config.server_settings()
  ---@type vim.lsp.Config
  local lsp_config = {
    init_options = settings,
    settings = { [protocol.CONFIGURATION_SECTION] = settings },
  }
  if config.options.cmd then
    lsp_config.cmd = config.options.cmd
  end
  if not config.use_inline() then
    -- Without the capability the server sends its suggestion as a completion item instead.
    lsp_config.before_init = function(params)
      params.capabilities.textDocument.inlineCompletion = nil
    end
  end
  if vim.lsp.config then
    vim.lsp.config('tabloop', lsp_config)
  end
  -- Clients already running pull the new settings.
  for _, client in ipairs(M.clients()) do
    local section = { [protocol.CONFIGURATION_SECTION] = settings }
    client.settings = vim.tbl_deep_extend('force', client.settings or {}, section)
    client:notify('workspace/didChangeConfiguration', { settings = section })
  end
end

---@param bufnr? integer
---@return vim.lsp.Client[]
function M.clients(bufnr)
  return vim.lsp.get_clients({ name = 'tabloop', bufnr = bufnr })
end

---@param mode string
---@param lhs string|false
---@param rhs string|function
---@param bufnr integer
---@param desc string
---@param expr? boolean
local function map(mode, lhs, rhs, bufnr, desc, expr)
  if lhs then
    vim.keymap.set(mode, lhs, rhs, { buffer = bufnr, desc = desc, expr = expr, silent = true })
  end
end

--- The ghost-text keys (0.12), which also take and dismiss a next edit; with no ghost text, the
--- accept and dismiss keys alone, for next edits, when the server offers them.
---@param client vim.lsp.Client
---@param bufnr integer
local function set_keymaps(client, bufnr)
  local keys = config.options.keymaps
  local ghost = config.use_inline()
  if not (ghost or (config.options.next_edit.enabled and next_edit.offered(client))) then
    return
  end
  local accept_key, dismiss_key = keys.accept, keys.dismiss
  map('i', accept_key, function()
    if ghost and inline.accept(bufnr) then
      return ''
    end
    if next_edit.visible(bufnr) then
      vim.schedule(function()
        next_edit.accept(bufnr)
      end)
      return ''
    end
    return vim.keycode(accept_key --[[@as string]])
  end, bufnr, ghost and 'tabloop: accept the suggestion' or 'tabloop: accept the next edit', true)
  map('i', dismiss_key, function()
    local shown = next_edit.visible(bufnr) ~= nil
    if shown or ghost then
      vim.schedule(function()
        next_edit.reject(bufnr, 'dismissed')
        if ghost then
          inline.dismiss(bufnr)
        end
      end)
      return ''
    end
    return vim.keycode(dismiss_key --[[@as string]])
  end, bufnr, ghost and 'tabloop: dismiss the suggestion' or 'tabloop: dismiss the next edit', true)
  if ghost then
    map('i', keys.next, function()
      inline.select(1)
    end, bufnr, 'tabloop: next suggestion')
    map('i', keys.prev, function()
      inline.select(-1)
    end, bufnr, 'tabloop: previous suggestion')
  end
end

--- Called by `lsp/tabloop.lua` when the server attaches to a buffer.
---@param client vim.lsp.Client
---@param bufnr integer
function M.attach(client, bufnr)
  if config.use_inline() then
    inline.attach(client, bufnr)
  else
    require('tabloop.completion').attach(client, bufnr)
  end
  next_edit.attach(client, bufnr)
  set_keymaps(client, bufnr)
end

--- Ask the server for its status; `callback(err, status)`.
---@param callback fun(err: lsp.ResponseError?, status: table?)
---@param bufnr? integer
function M.status(callback, bufnr)
  local client = M.clients(bufnr)[1] or M.clients()[1]
  if not client then
    callback({ code = -1, message = 'tabloop is not running (:checkhealth vim.lsp)' }, nil)
    return
  end
  client:request(protocol.STATUS_REQUEST, {}, function(err, result)
    callback(err, result)
  end, bufnr)
end

--- One line for a statusline: model state, indexing and policy version (from the last answer).
---@type string
M.last_status_line = ''

---@param status table
---@return string
function M.format_status(status)
  local model = status.model or {}
  local index = status.index or {}
  local parts = { 'tabloop' }
  if model.state == 'ready' then
    table.insert(parts, 'policy ' .. ((status.policy or {}).version or 'none'))
  else
    table.insert(parts, 'model ' .. tostring(model.state))
  end
  if index.state == 'indexing' and type(index.total) == 'number' and index.total > 0 then
    table.insert(parts, ('indexing %d%%'):format(math.floor(100 * (index.done or 0) / index.total)))
  elseif type(index.state) == 'string' and index.state ~= 'ready' then
    table.insert(parts, 'index ' .. index.state)
  end
  local training = status.training or {}
  if training.state == 'training' or training.state == 'paused' or training.state == 'judging' then
    table.insert(parts, training.state) -- the next adapter is being trained in the background
  end
  return table.concat(parts, ' · ')
end

--- For 'statusline': `%{v:lua.require'tabloop'.statusline()}`.
---@return string
function M.statusline()
  return M.last_status_line
end

--- Refresh `M.last_status_line`.
function M.refresh_status()
  M.status(function(err, status)
    if not err and status then
      M.last_status_line = M.format_status(status)
    end
  end)
end

return M
