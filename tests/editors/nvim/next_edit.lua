-- Next edits in Neovim 0.12 against a language server that answers them from a script
-- (`tests.support.next_edit_server`): typing a rename asks after the pause, the prediction is drawn
-- with extmarks, <Tab> applies it (the server's copy of the document follows) and runs
-- `tabloop.acceptNextEdit`; the next one is typed over, dismissed with <C-]>, left by moving the
-- cursor; an edit off screen gets a jump hint, <Tab> jumps there, <Tab> again applies it, and
-- Neovim's inline completion asks nothing in between, nor after, until a key is typed. Writes a
-- JSON report for tests/editors/test_neovim_next_edit.py.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))
local cfg, report = h.cfg, h.report

local NS = vim.api.nvim_create_namespace('tabloop.next_edit')
local WAIT_MS = 20000

--- The next-edit extmarks of the buffer, in a form JSON keeps.
local function marks()
  local found = {}
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(h.bufnr, NS, 0, -1, { details = true })) do
    local details = mark[4]
    local texts = function(chunks)
      return vim.tbl_map(function(chunk)
        return { chunk[1], chunk[2] }
      end, chunks or {})
    end
    found[#found + 1] = {
      row = mark[2],
      col = mark[3],
      end_row = details.end_row or vim.NIL,
      end_col = details.end_col or vim.NIL,
      hl_group = details.hl_group or vim.NIL,
      virt_text = texts(details.virt_text),
      virt_text_pos = details.virt_text_pos or vim.NIL,
      virt_lines = vim.tbl_map(texts, details.virt_lines or {}),
      virt_lines_above = details.virt_lines_above or false,
    }
  end
  return found
end

local function server_log()
  return h.request('scripted/log', {})
end

--- The entries of the server's log with `method` (or `command`).
local function logged(name)
  return vim.tbl_filter(function(entry)
    return entry.method == name or entry.command == name
  end, server_log())
end

--- Neovim's automatic inline completion requests the plugin did not send in this buffer.
local function held_back()
  return require('tabloop.inline').held_back[h.bufnr] or 0
end

local function shown()
  return require('tabloop.next_edit').visible(h.bufnr)
end

local function wait_shown(what)
  h.wait(WAIT_MS, what, function()
    return shown() ~= nil and #marks() > 0
  end)
end

local function lines()
  return vim.api.nvim_buf_get_lines(h.bufnr, 0, -1, true)
end

h.run(function()
  h.step('start', function()
    h.start()
    report.capabilities = h.client.server_capabilities.experimental
    report.highlights = {}
    for _, name in ipairs({ 'TabloopNextEditDelete', 'TabloopNextEditInsert', 'TabloopNextEditJump' }) do
      report.highlights[name] = vim.api.nvim_get_hl(0, { name = name }).link or vim.NIL
    end
  end)

  h.step('shown', function()
    vim.api.nvim_win_set_cursor(0, { cfg.line, 0 })
    h.type_keys('A):')
    wait_shown('the first prediction')
    report.first = { marks = marks(), id = shown().items[1].id, cursor = vim.api.nvim_win_get_cursor(0) }
    h.wait(5000, 'didShowInlineEdit', function()
      return #logged('textDocument/didShowInlineEdit') > 0
    end)
    report.first.shows = vim.tbl_map(function(entry)
      return entry.params.item.id
    end, logged('textDocument/didShowInlineEdit'))
    report.first.requests = vim.tbl_map(function(entry)
      return { outcome = entry.outcome, version = entry.params.textDocument.version, context = entry.params.context }
    end, logged('textDocument/copilotInlineEdit'))
  end)

  h.step('accept', function()
    -- A pause Neovim would never reach: the request after Tab must go out at once.
    local next_edit = require('tabloop.next_edit')
    local debounce = next_edit.DEBOUNCE_MS
    next_edit.DEBOUNCE_MS = 3600 * 1000
    local requests_before = #logged('textDocument/copilotInlineEdit')
    h.type_keys('<Tab>')
    h.wait(5000, 'the edit applied', function()
      local now = shown() -- the next one may be shown already
      return (now == nil or now.items[1].id ~= report.first.id) and lines()[cfg.line + 1] ~= cfg.second_line_before
    end)
    report.accepted = { lines = lines(), cursor = vim.api.nvim_win_get_cursor(0), mode = vim.api.nvim_get_mode().mode }
    -- The server's copy of the document, after the didChange the edit made.
    report.accepted.server_text = h.request('scripted/document', { uri = vim.uri_from_bufnr(h.bufnr) })
    h.wait(5000, 'the acceptance', function()
      return #logged('tabloop.acceptNextEdit') > 0
    end)
    report.accepted.commands = vim.tbl_map(function(entry)
      return entry.arguments
    end, logged('tabloop.acceptNextEdit'))
    wait_shown('the prediction after the acceptance')
    next_edit.DEBOUNCE_MS = debounce
    local log = server_log()
    local accepted_at
    for i, entry in ipairs(log) do
      if entry.command == 'tabloop.acceptNextEdit' then
        accepted_at = i
      end
    end
    report.accepted.requests_after = {}
    for i, entry in ipairs(log) do
      if entry.method == 'textDocument/copilotInlineEdit' and i > accepted_at then
        table.insert(report.accepted.requests_after, {
          outcome = entry.outcome,
          version = entry.params.textDocument.version,
          context = entry.params.context,
        })
      end
    end
    report.accepted.requests_total = #logged('textDocument/copilotInlineEdit') - requests_before
    report.accepted.version = vim.lsp.util.buf_versions[h.bufnr]
  end)

  h.step('typed_over', function()
    -- The prediction asked for after the acceptance (lines inserted).
    report.second = { marks = marks(), id = shown().items[1].id }
    h.type_keys(' ')
    h.wait(5000, 'the rejection', function()
      return #logged('tabloop/nextEditRejected') > 0
    end)
  end)

  h.step('dismissed', function()
    wait_shown('a prediction after typing on')
    report.third = { id = shown().items[1].id }
    local before = lines()
    h.type_keys('<C-]>')
    h.wait(5000, 'the prediction to go', function()
      return shown() == nil and #marks() == 0
    end)
    report.third.unchanged = vim.deep_equal(before, lines())
    report.third.mode = vim.api.nvim_get_mode().mode
  end)

  h.step('moved', function()
    h.type_keys(' ')
    wait_shown('a prediction after typing again')
    report.fourth = { id = shown().items[1].id }
    h.type_keys('<Left>')
    h.wait(5000, 'the prediction to go', function()
      return shown() == nil
    end)
    h.wait(5000, 'the rejections', function()
      return #logged('tabloop/nextEditRejected') >= 3
    end)
    report.rejections = vim.tbl_map(function(entry)
      return entry.params
    end, logged('tabloop/nextEditRejected'))
  end)

  h.step('jump', function()
    h.type_keys('<End># jump')
    wait_shown('the off-screen prediction')
    report.far = { marks = marks(), cursor = vim.api.nvim_win_get_cursor(0), top = vim.fn.line('w0'), bottom = vim.fn.line('w$') }
    local inline_before = #logged('textDocument/inlineCompletion')
    local held_before = held_back()
    h.type_keys('<Tab>')
    h.wait(5000, 'the jump', function()
      return vim.api.nvim_win_get_cursor(0)[1] == cfg.far_line
    end)
    -- Neovim's inline completion asks 200 ms after the cursor moved: the plugin holds it back.
    h.wait(5000, 'the inline request after the jump, held back', function()
      return held_back() > held_before
    end)
    report.jumped = {
      cursor = vim.api.nvim_win_get_cursor(0),
      top = vim.fn.line('w0'),
      bottom = vim.fn.line('w$'),
      still_shown = shown() ~= nil,
      marks = marks(),
      inline_requests = #logged('textDocument/inlineCompletion') - inline_before,
    }
    h.type_keys('<Tab>')
    h.wait(5000, 'the far edit applied', function()
      return shown() == nil and lines()[cfg.far_line] ~= cfg.far_line_before
    end)
    report.far_after = { line = lines()[cfg.far_line], cursor = vim.api.nvim_win_get_cursor(0) }
    h.wait(5000, 'the second acceptance', function()
      return #logged('tabloop.acceptNextEdit') >= 2
    end)
    h.wait(5000, 'the inline request after the acceptance, held back', function()
      return held_back() > held_before + 1
    end)
    report.far_after.inline_requests = #logged('textDocument/inlineCompletion') - inline_before
    report.far_after.line_later = lines()[cfg.far_line]
  end)

  h.step('typed_after', function()
    -- Typing hands the cursor back to the ghost text.
    local inline_before = #logged('textDocument/inlineCompletion')
    h.type_keys('x')
    h.wait(5000, 'an inline completion request', function()
      return #logged('textDocument/inlineCompletion') > inline_before
    end)
    local asked = logged('textDocument/inlineCompletion')
    report.typed_after = { request = asked[#asked] }
    report.final_log = server_log()
    h.type_keys('<Esc>')
  end)

  h.step('stop', h.stop)
end)
