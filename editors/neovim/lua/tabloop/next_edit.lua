--- Next-edit suggestions: after a pause in typing (insert mode), ask the server for the edit the
--- user is about to make near the cursor (`textDocument/copilotInlineEdit`; one request at a
--- time, the previous one cancelled), draw it (`tabloop.next_edit_view`), and let the ghost-text
--- keys take it (<Tab>: jump to it first when it is off screen, then apply all its edits, and ask
--- for the one after at once) or dismiss it (<C-]>). The server hears what happened:
--- `textDocument/didShowInlineEdit` when one is drawn, `tabloop.acceptNextEdit` after its edits are
--- applied, `tabloop/nextEditRejected` with why it went (dismissed, typed over, cursor moved away).
local config = require('tabloop.config')
local protocol = require('tabloop.protocol')
local view = require('tabloop.next_edit_view')

local M = {}

--- Quiet time after a keystroke before asking (the protocol's ~300 ms).
M.DEBOUNCE_MS = 300
local AUTOMATIC, INVOKED = 2, 1

--- Per buffer: the debounce timer, the request in flight, the prediction shown, and where the
--- last acceptance left the buffer (its changedtick and the cursor).
---@type table<integer, { timer: uv.uv_timer_t?, request: { client_id: integer, id: integer }?, shown: table?, accepted: { tick: integer, cursor: integer[] }? }>
M.buffers = {}

---@param bufnr integer
local function state(bufnr)
  M.buffers[bufnr] = M.buffers[bufnr] or {}
  return M.buffers[bufnr]
end

--- Whether the server offers next edits (`capabilities.experimental.tabloop.nextEdit`).
---@param client vim.lsp.Client
---@return boolean
function M.offered(client)
  local experimental = (client.server_capabilities or {}).experimental
  local tabloop = type(experimental) == 'table' and experimental[protocol.CONFIGURATION_SECTION] or nil
  return type(tabloop) == 'table' and tabloop[protocol.NEXT_EDIT_CAPABILITY] == true
end

---@param a lsp.Position
---@param b lsp.Position
---@return integer
local function compare(a, b)
  return a.line ~= b.line and a.line - b.line or a.character - b.character
end

--- The items of an answer when they make one prediction for `uri` at `version` (one id, sorted,
--- non-overlapping ranges), else nil (no change, or an answer that breaks the protocol).
---@param result any
---@param uri string
---@param version integer
---@return table[]?
function M.prediction(result, uri, version)
  local edits = type(result) == 'table' and result.edits or nil
  if type(edits) ~= 'table' or #edits == 0 then
    return nil
  end
  local id = edits[1].id
  for i, item in ipairs(edits) do
    local document = item.textDocument or {}
    local range = item.range
    if
      type(item.id) ~= 'string'
      or item.id == ''
      or item.id ~= id
      or document.uri ~= uri
      or document.version ~= version
      or type(item.text) ~= 'string'
      or type(range) ~= 'table'
      or compare(range.start, range['end']) > 0
      or (i > 1 and compare(edits[i - 1].range['end'], range.start) > 0)
    then
      return nil
    end
  end
  return edits
end

--- The prediction shown in `bufnr`, if any.
---@param bufnr? integer
---@return table?
function M.visible(bufnr)
  local buffer = M.buffers[vim._resolve_bufnr(bufnr)]
  return buffer and buffer.shown
end

--- Whether `bufnr` and its cursor are as the last acceptance left them (nothing typed or moved).
---@param bufnr integer
---@return boolean
local function as_accepted(bufnr)
  local accepted = (M.buffers[bufnr] or {}).accepted
  local winid = vim.fn.bufwinid(bufnr)
  return accepted ~= nil
    and winid ~= -1
    and accepted.tick == vim.api.nvim_buf_get_changedtick(bufnr)
    and vim.deep_equal(accepted.cursor, vim.api.nvim_win_get_cursor(winid))
end

--- Whether the cursor of `bufnr` belongs to next edits now: a prediction is shown there (also at
--- the edit the plugin jumped to), or the buffer and the cursor are as the last acceptance left
--- them. Typing or moving the cursor ends it. While it lasts, Neovim's own inline completion,
--- which asks after every cursor move, the plugin's too, is kept from asking (`tabloop.inline`):
--- ghost text there would come between <Tab> and the edit, or after it, beside the next one.
---@param bufnr? integer
---@return boolean
function M.holds_cursor(bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  local buffer = M.buffers[bufnr]
  return buffer ~= nil and (buffer.shown ~= nil or as_accepted(bufnr))
end

---@param bufnr integer
local function cancel_pending(bufnr)
  local buffer = state(bufnr)
  if buffer.timer then
    buffer.timer:stop()
  end
  local request = buffer.request
  buffer.request = nil
  local client = request and vim.lsp.get_client_by_id(request.client_id)
  if client and not client:is_stopped() then
    client:cancel_request(request.id)
  end
end

---@param bufnr integer
---@return table? shown
local function hide(bufnr)
  local buffer = M.buffers[bufnr]
  local shown = buffer and buffer.shown
  if shown then
    buffer.shown = nil
    view.clear(bufnr)
  end
  return shown
end

--- Take the prediction away and tell the server why.
---@param bufnr? integer
---@param reason 'dismissed'|'typed'|'moved'
---@return boolean whether one was shown
function M.reject(bufnr, reason)
  local shown = hide(vim._resolve_bufnr(bufnr))
  local client = shown and vim.lsp.get_client_by_id(shown.client_id)
  if client and not client:is_stopped() then
    client:notify(protocol.NEXT_EDIT_REJECTED_NOTIFICATION, { id = shown.items[1].id, reason = reason })
  end
  return shown ~= nil
end

---@param winid integer
---@return integer first, integer last 0-based rows on screen
local function screen_rows(winid)
  return vim.fn.line('w0', winid) - 1, vim.fn.line('w$', winid) - 1
end

---@param shown table
local function draw(bufnr, shown)
  local jump = shown.jump_pending and { row = shown.cursor[1] - 1, target = shown.items[1].range.start.line } or nil
  view.draw(bufnr, shown.items, shown.encoding, jump)
end

---@param bufnr integer
---@param client vim.lsp.Client
---@param items table[]
local function show(bufnr, client, items)
  M.reject(bufnr, 'dismissed') -- one still shown (an explicit request while it was)
  local winid = vim.fn.bufwinid(bufnr)
  local first, last = screen_rows(winid)
  local shown = {
    client_id = client.id,
    items = items,
    encoding = client.offset_encoding,
    version = vim.lsp.util.buf_versions[bufnr],
    cursor = vim.api.nvim_win_get_cursor(winid),
    jump_pending = items[1].range.start.line < first or items[#items].range['end'].line > last,
  }
  state(bufnr).shown = shown
  draw(bufnr, shown)
  client:notify(protocol.DID_SHOW_INLINE_EDIT_NOTIFICATION, { item = items[1] })
end

--- Ask now for the cursor of the current window (trigger kind `kind`, automatic by default); the
--- answer is shown if the buffer, the cursor and Insert mode are still as they were.
---@param bufnr? integer
---@param kind? integer
---@return boolean whether a request went out
function M.request(bufnr, kind)
  bufnr = vim._resolve_bufnr(bufnr)
  local winid = vim.fn.bufwinid(bufnr)
  local client = vim.tbl_filter(M.offered, vim.lsp.get_clients({ name = 'tabloop', bufnr = bufnr }))[1]
  if not client or winid == -1 or not config.options.next_edit.enabled then
    return false
  end
  cancel_pending(bufnr)
  local params = vim.lsp.util.make_position_params(winid, client.offset_encoding)
  local version = vim.lsp.util.buf_versions[bufnr]
  params.textDocument.version = version
  ---@diagnostic disable-next-line: inject-field
  params.context = { triggerKind = kind or AUTOMATIC }
  local cursor = vim.api.nvim_win_get_cursor(winid)
  local buffer = state(bufnr)
  local request
  local ok, id = client:request(protocol.NEXT_EDIT_REQUEST, params, function(err, result)
    if buffer.request ~= request then
      return -- cancelled, or a newer request took over
    end
    buffer.request = nil
    if err or vim.lsp.util.buf_versions[bufnr] ~= version or vim.fn.bufwinid(bufnr) ~= winid then
      return
    end
    if not vim.deep_equal(vim.api.nvim_win_get_cursor(winid), cursor) or not vim.fn.mode():match('^i') then
      return
    end
    local items = M.prediction(result, params.textDocument.uri, version)
    if items then
      show(bufnr, client, items)
    end
  end, bufnr)
  if ok and id then
    request = { client_id = client.id, id = id }
    buffer.request = request
  end
  return ok and id ~= nil
end

--- Ask after the pause: every keystroke starts the wait again.
---@param bufnr integer
local function schedule(bufnr)
  cancel_pending(bufnr)
  local buffer = state(bufnr)
  buffer.timer = buffer.timer or assert(vim.uv.new_timer())
  buffer.timer:start(
    M.DEBOUNCE_MS,
    0,
    vim.schedule_wrap(function()
      if vim.api.nvim_buf_is_valid(bufnr) and vim.api.nvim_get_current_buf() == bufnr then
        M.request(bufnr, AUTOMATIC)
      end
    end)
  )
end

--- <Tab>: jump to an off-screen prediction, else apply all its edits, put the cursor after them
--- and run `tabloop.acceptNextEdit`. False when none is shown.
---@param bufnr? integer
---@return boolean
function M.accept(bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  local shown = M.visible(bufnr)
  local client = shown and vim.lsp.get_client_by_id(shown.client_id)
  if not (shown and client) then
    return false
  end
  local winid = vim.fn.bufwinid(bufnr)
  if shown.jump_pending then
    local row, col = view.byte_position(bufnr, shown.items[1].range.start, shown.encoding)
    shown.jump_pending = false
    shown.cursor = { row + 1, col } -- before moving it, so that the move does not dismiss
    vim.api.nvim_win_set_cursor(winid, shown.cursor)
    local height = vim.api.nvim_win_get_height(winid)
    vim.fn.winrestview({ topline = math.max(1, row + 1 - math.floor(height / 2)) })
    draw(bufnr, shown)
    return true
  end
  hide(bufnr)
  if vim.lsp.util.buf_versions[bufnr] ~= shown.version then
    return false
  end
  -- A mark at the end of the last range, pushed along by the text put in there, is where the
  -- cursor goes.
  local row, col = view.byte_position(bufnr, shown.items[#shown.items].range['end'], shown.encoding)
  local mark = vim.api.nvim_buf_set_extmark(bufnr, view.NS, row, col, { right_gravity = true })
  local edits = vim.tbl_map(function(item)
    return { range = item.range, newText = item.text }
  end, shown.items)
  vim.lsp.util.apply_text_edits(edits, bufnr, shown.encoding)
  local after = vim.api.nvim_buf_get_extmark_by_id(bufnr, view.NS, mark, {})
  vim.api.nvim_buf_del_extmark(bufnr, view.NS, mark)
  pcall(vim.api.nvim_win_set_cursor, winid, { after[1] + 1, after[2] })
  state(bufnr).accepted = {
    tick = vim.api.nvim_buf_get_changedtick(bufnr),
    cursor = vim.api.nvim_win_get_cursor(winid),
  }
  local command = { command = protocol.ACCEPT_NEXT_EDIT_COMMAND, arguments = { shown.items[1].id } }
  client:request('workspace/executeCommand', command, function() end, bufnr)
  -- Tab is one keystroke, not typing: the prediction after it is asked for at once (the server
  -- has computed it while the user read this one), not after the pause.
  M.request(bufnr, AUTOMATIC)
  return true
end

---@param client vim.lsp.Client
---@param bufnr integer
function M.attach(client, bufnr)
  if not (config.options.next_edit.enabled and M.offered(client)) then
    return
  end
  view.define_highlights()
  local group = vim.api.nvim_create_augroup('tabloop.next_edit.' .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd('TextChangedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      if as_accepted(bufnr) then
        return -- the acceptance's own change: the request after it went out already
      end
      M.reject(bufnr, 'typed')
      schedule(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd('CursorMovedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      local shown = M.visible(bufnr)
      -- Typing moves the cursor too; TextChangedI handles that.
      if shown and vim.lsp.util.buf_versions[bufnr] == shown.version then
        if not vim.deep_equal(vim.api.nvim_win_get_cursor(0), shown.cursor) then
          M.reject(bufnr, 'moved')
        end
      end
    end,
  })
  vim.api.nvim_create_autocmd('InsertLeave', {
    group = group,
    buffer = bufnr,
    callback = function()
      cancel_pending(bufnr)
      M.reject(bufnr, 'dismissed')
      state(bufnr).accepted = nil -- back in Insert mode, the cursor is the user's again
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufDelete', 'LspDetach' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      cancel_pending(bufnr)
      hide(bufnr)
      local buffer = M.buffers[bufnr]
      if buffer and buffer.timer then
        buffer.timer:close()
      end
      M.buffers[bufnr] = nil
    end,
  })
end

return M
