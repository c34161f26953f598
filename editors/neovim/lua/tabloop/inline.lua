--- Ghost text: native inline completion (Neovim 0.12+), with the tabloop/didShow and
--- tabloop/didDismiss notifications that tell the server what the user saw.
local protocol = require('tabloop.protocol')

local M = {}

local NS = vim.api.nvim_create_namespace('nvim.lsp.inline_completion')
local METHOD = 'textDocument/inlineCompletion'

--- Per buffer: the tabloop decision shown now, if any.
---@type table<integer, { client_id: integer, decision_id: string }?>
M.shown = {}

---@param item table lsp.InlineCompletionItem
---@return string?
local function decision_id(item)
  local command = item and item.command
  if command and command.command == protocol.ACCEPT_COMMAND and command.arguments then
    return command.arguments[1]
  end
end

---@param bufnr integer
---@return boolean
local function ghost_text_visible(bufnr)
  return #vim.api.nvim_buf_get_extmarks(bufnr, NS, 0, -1, { limit = 1 }) > 0
end

---@param client vim.lsp.Client
---@param method string
---@param decision string
local function notify(client, method, decision)
  if not client:is_stopped() then
    client:notify(method, { decisionId = decision })
  end
end

--- Forget (and report as dismissed) the suggestion shown in `bufnr`.
---@param bufnr integer
---@param dismissed boolean
local function forget(bufnr, dismissed)
  local shown = M.shown[bufnr]
  M.shown[bufnr] = nil
  if shown and dismissed then
    local client = vim.lsp.get_client_by_id(shown.client_id)
    if client then
      notify(client, protocol.DID_DISMISS_NOTIFICATION, shown.decision_id)
    end
  end
end

--- Watches the client's inline completion answers: after Neovim draws one, report it shown.
---@param client vim.lsp.Client
local function watch_answers(client)
  if client._tabloop_watched then
    return
  end
  client._tabloop_watched = true
  local request = client.request
  client.request = function(self, method, params, handler, bufnr)
    if method ~= METHOD or not handler then
      return request(self, method, params, handler, bufnr)
    end
    local target = vim._resolve_bufnr(bufnr)
    return request(self, method, params, function(err, result, ctx, config)
      handler(err, result, ctx, config)
      local items = result and (result.items or result) or {}
      local decision = decision_id(items[1])
      if decision and ghost_text_visible(target) then
        local previous = M.shown[target]
        if not (previous and previous.decision_id == decision) then
          forget(target, false)
          M.shown[target] = { client_id = self.id, decision_id = decision }
          notify(self, protocol.DID_SHOW_NOTIFICATION, decision)
        end
      end
    end, bufnr)
  end
end

--- Accept the ghost text; false when none is shown (so a mapping can fall back to its key).
---@param bufnr? integer
---@return boolean
function M.accept(bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  local accepted = vim.lsp.inline_completion.get({ bufnr = bufnr })
  if accepted then
    -- The accepted item's command (`tabloop.accept`) reports it; it is no longer "shown".
    M.shown[bufnr] = nil
  end
  return accepted
end

--- Show the next (count > 0) or previous suggestion.
---@param count integer
function M.select(count)
  vim.lsp.inline_completion.select({ count = count })
end

--- Hide the ghost text and tell the server it was dismissed.
---@param bufnr? integer
---@return boolean whether something was shown
function M.dismiss(bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  local visible = ghost_text_visible(bufnr)
  -- There is no public "hide": switching inline completion off and on again for the buffer
  -- clears the ghost text and drops the pending request; typing asks again as usual.
  vim.lsp.inline_completion.enable(false, { bufnr = bufnr })
  vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
  forget(bufnr, true)
  return visible
end

---@param client vim.lsp.Client
---@param bufnr integer
function M.attach(client, bufnr)
  watch_answers(client)
  vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
  local group = vim.api.nvim_create_augroup('tabloop.inline.' .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd('InsertLeave', {
    group = group,
    buffer = bufnr,
    callback = function()
      -- Leaving insert mode hides the ghost text: that is a dismissal.
      forget(bufnr, true)
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufDelete', 'LspDetach' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.shown[bufnr] = nil
    end,
  })
end

return M
