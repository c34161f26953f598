-- Suggestions as completion items: the path of Neovim 0.11 users, and of 0.12 users who set
-- `inline_completion = false`. The plugin withholds the inline completion capability, so the
-- server answers textDocument/completion; it turns on `vim.lsp.completion`, and taking the item
-- runs its tabloop.accept command. Writes a JSON report for tests/editors/test_neovim.py.
--
-- 'completeopt' is what `:help lsp-autocompletion` recommends (menuone: a lone item still gets a
-- menu, so <C-y> is the completion key; with Neovim's default `menu,popup` a lone item is inserted
-- without a menu, and <C-y> then ends completion and types the character above the cursor).
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))
local cfg, report = h.cfg, h.report

h.run(function()
  h.step('start', function()
    h.start({ inline_completion = false })
    report.server_inline_provider = h.client.server_capabilities.inlineCompletionProvider ~= nil
  end)

  h.step('ready', h.wait_ready)

  --- Types `A` on the scenario's line and asks for completion; returns the items offered.
  local function complete_at_line()
    vim.api.nvim_win_set_cursor(0, { cfg.line, 0 })
    h.type_keys('A')
    -- Ask for completion as a user would (<C-x><C-o> reaches the same items with 'omnifunc').
    vim.lsp.completion.get()
    h.wait(60000, 'the completion items', function()
      return #vim.fn.complete_info({ 'items' }).items > 0
    end)
    return vim.fn.complete_info({ 'items' }).items
  end

  h.step('select_then_leave', function()
    vim.o.completeopt = 'menuone,noselect,popup'
    local original = vim.api.nvim_buf_get_lines(h.bufnr, 0, -1, true)
    local before = h.status().decisions.accepted
    complete_at_line()
    h.type_keys('<C-n>')
    -- <Esc> with the item selected keeps its word, and no more: it was not taken.
    h.type_keys('<Esc>')
    report.left = {
      line = h.line(),
      next_line = vim.api.nvim_buf_get_lines(h.bufnr, cfg.line, cfg.line + 1, true)[1],
      accepted = h.status().decisions.accepted - before,
    }
    vim.api.nvim_buf_set_lines(h.bufnr, 0, -1, true, original)
  end)

  h.step('complete', function()
    local before = h.status().decisions.accepted
    local items = complete_at_line()
    report.line_before = h.line() -- 'noselect': nothing is inserted before an item is selected
    report.menu = vim.tbl_map(function(item)
      return { word = item.word, menu = item.menu, kind = item.kind }
    end, items)
    report.pum_visible = vim.fn.pumvisible() == 1
    -- Select the item ('noselect': nothing is yet): Neovim inserts its word; then take it.
    assert(vim.fn.complete_info({ 'selected' }).selected < 0, 'an item was selected already')
    h.type_keys('<C-n>')
    report.line_selected = h.line()
    h.type_keys('<C-y>')
    h.wait(5000, 'the item to be inserted', function()
      return h.line() ~= report.line_before
    end)
    report.line_after = h.line()
    report.cursor_after = vim.api.nvim_win_get_cursor(0)
    report.buffer_after = vim.api.nvim_buf_get_lines(h.bufnr, 0, -1, true)
    report.completed_text = (items[1].user_data.nvim.lsp.completion_item.textEdit or {}).newText
    h.wait(10000, 'the server to record the acceptance', function()
      return h.status().decisions.accepted == before + 1
    end)
    report.status_after_accept = h.status()
    h.type_keys('<Esc>')
  end)

  h.step('stop', h.stop)
end)
