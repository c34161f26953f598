--- Ghost text: native inline completion (Neovim 0.12+), with the tabloop/didShow and
--- tabloop/didDismiss notifications that tell the server what the user saw.
---
--- Typing asks for one suggestion; cycling (`select`) asks for all the candidates of an explicit
--- request (trigger kind Invoked) and reports each one Neovim draws. Neovim keeps the items and the
--- index of the one drawn to itself, so the plugin keeps its own index of the answer it watched,
--- moved by the same rule as `vim.lsp.inline_completion.select` (wrapping at both ends).
---
--- Neovim asks on its own after every cursor move in insert mode; while next edits hold the cursor
--- (`tabloop.next_edit.holds_cursor`: one shown, or the buffer as the last one taken left it), those
--- automatic requests are not sent.
local next_edit = require('tabloop.next_edit')
local protocol = require('tabloop.protocol')

local M = {}

local NS = vim.api.nvim_create_namespace('nvim.lsp.inline_completion')
local METHOD = 'textDocument/inlineCompletion'
local INVOKED = 1 -- lsp.InlineCompletionTriggerKind.Invoked

--- Per buffer: the tabloop decision shown now, if any.
---@type table<integer, { client_id: integer, decision_id: string }?>
M.shown = {}

--- Per buffer: the answer Neovim draws from, as the decision ids of its items in order (false for
--- an item without one), the index of the item drawn, and whether it answered an explicit request.
---@type table<integer, { client_id: integer, ids: (string|false)[], index: integer, explicit: boolean }?>
M.answers = {}

--- Per buffer: the handler Neovim gave its latest inline completion request, which draws an answer.
---@type table<integer, { client_id: integer, handler: function }?>
M.handlers = {}

--- Per buffer: how many of Neovim's automatic requests were not sent, next edits holding the cursor.
---@type table<integer, integer>
M.held_back = {}

--- Per buffer: the move `select` asked for until the explicit request it sent is answered (cleared
--- with the suggestion too: Neovim drops the answer of a request it cancels, on accept, dismiss
--- or leaving insert mode).
---@type table<integer, integer?>
M.pending_moves = {}

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
  M.answers[bufnr] = nil
  M.pending_moves[bufnr] = nil
  if shown and dismissed then
    local client = vim.lsp.get_client_by_id(shown.client_id)
    if client then
      notify(client, protocol.DID_DISMISS_NOTIFICATION, shown.decision_id)
    end
  end
end

--- Report `decision` shown in `bufnr`, once per change of the suggestion on screen.
---@param bufnr integer
---@param client vim.lsp.Client
---@param decision string
local function report_shown(bufnr, client, decision)
  local previous = M.shown[bufnr]
  if previous and previous.decision_id == decision then
    return
  end
  M.shown[bufnr] = { client_id = client.id, decision_id = decision }
  notify(client, protocol.DID_SHOW_NOTIFICATION, decision)
end

--- Whether `client` is the only one that can put inline completions in `bufnr`: Neovim numbers
--- the items of every client together, and the plugin sees only its own client's answers.
---@param bufnr integer
---@param client vim.lsp.Client
---@return boolean
local function sole_provider(bufnr, client)
  for _, other in ipairs(vim.lsp.get_clients({ bufnr = bufnr, method = METHOD })) do
    if other.id ~= client.id then
      return false
    end
  end
  return true
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
    local explicit = params and params.context and params.context.triggerKind == INVOKED or false
    if not explicit and next_edit.holds_cursor(target) then
      M.held_back[target] = (M.held_back[target] or 0) + 1
      return false, nil -- not sent: Neovim asks again after the next keystroke or move
    end
    M.handlers[target] = { client_id = self.id, handler = handler }
    return request(self, method, params, function(err, result, ctx, config)
      handler(err, result, ctx, config)
      -- The move that asked for these candidates (an answer to typing may arrive first).
      local move = explicit and M.pending_moves[target] or nil
      if explicit then
        M.pending_moves[target] = nil
      end
      if err or not result then
        return -- Neovim keeps what it showed
      end
      local items = result.items or result
      local ids = {} ---@type (string|false)[]
      for i, item in ipairs(items) do
        ids[i] = decision_id(item) or false
      end
      -- Neovim draws the first item of every answer.
      M.answers[target] = nil
      if not (ids[1] and ghost_text_visible(target)) then
        return
      end
      if sole_provider(target, self) then
        M.answers[target] = { client_id = self.id, ids = ids, index = 1, explicit = explicit }
      end
      report_shown(target, self, ids[1] --[[@as string]])
      if move and #ids > 1 then
        M.select(move, target)
      end
    end, bufnr)
  end
end

--- Ask the server for every candidate at the cursor (an explicit request, trigger kind Invoked);
--- Neovim draws the answer's first one. False when the buffer has no inline completion to ask
--- with yet (Neovim's own first request after entering insert mode makes one).
---@param bufnr? integer
---@return boolean
function M.request_candidates(bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  local saved = M.handlers[bufnr]
  local client = saved and vim.lsp.get_client_by_id(saved.client_id)
  local winid = vim.fn.bufwinid(bufnr)
  if
    not (saved and client)
    or client:is_stopped()
    or winid == -1
    or not vim.lsp.inline_completion.is_enabled({ bufnr = bufnr })
  then
    return false
  end
  local params = vim.lsp.util.make_position_params(winid, client.offset_encoding)
  ---@diagnostic disable-next-line: inject-field
  params.context = { triggerKind = INVOKED }
  -- Answered through Neovim's own handler, so Neovim holds and draws the candidates.
  client:request(METHOD, params, saved.handler, bufnr)
  return true
end

--- Accept the ghost text; false when none is shown (so a mapping can fall back to its key).
---@param bufnr? integer
---@return boolean
function M.accept(bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  local accepted = vim.lsp.inline_completion.get({ bufnr = bufnr })
  if accepted then
    -- The accepted item's command (`tabloop.accept`) reports it; it is no longer "shown".
    forget(bufnr, false)
  end
  return accepted
end

--- Show the next (count > 0) or previous suggestion, and report the one drawn. With one
--- suggestion or none from typing, ask for every candidate first, then move.
---@param count integer
---@param bufnr? integer
function M.select(count, bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  if M.pending_moves[bufnr] then
    -- Candidates asked for and not answered yet: move further once they are.
    M.pending_moves[bufnr] = M.pending_moves[bufnr] + count
    return
  end
  local answer = M.answers[bufnr]
  if not (answer and answer.explicit) and (not answer or #answer.ids < 2) then
    if M.request_candidates(bufnr) then
      M.pending_moves[bufnr] = count
      return
    end
  end
  -- Neovim's select moves only while an item is drawn.
  local visible = ghost_text_visible(bufnr)
  vim.lsp.inline_completion.select({ bufnr = bufnr, count = count })
  if not (answer and visible and #answer.ids > 0) then
    return
  end
  -- The same rule as vim.lsp.inline_completion.select with `wrap` (its default).
  answer.index = (answer.index - 1 + count) % #answer.ids + 1
  local decision = answer.ids[answer.index]
  local client = vim.lsp.get_client_by_id(answer.client_id)
  if decision and client then
    report_shown(bufnr, client, decision)
  end
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
  M.handlers[bufnr] = nil -- it drew for the inline completion just switched off
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
      forget(bufnr, false)
      M.handlers[bufnr] = nil
      M.held_back[bufnr] = nil
    end,
  })
end

return M
