-- Suggestions as completion items: the path of Neovim 0.11 users, and of 0.12 users who set
-- `inline_completion = false`. The plugin withholds the inline completion capability, so the
-- server answers textDocument/completion; it turns on `vim.lsp.completion`, and taking the item
-- runs its tabloop.accept command. Writes a JSON report for tests/editors/test_neovim.py.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))
local cfg, report = h.cfg, h.report

h.run(function()
  h.step('start', function()
    h.start({ inline_completion = false })
    report.server_inline_provider = h.client.server_capabilities.inlineCompletionProvider ~= nil
  end)

  h.step('ready', h.wait_ready)

  h.step('complete', function()
    vim.api.nvim_win_set_cursor(0, { cfg.line, 0 })
    h.type_keys('A')
    report.line_before = h.line()
    local before = h.status().decisions.accepted
    -- Ask for completion as a user would (<C-x><C-o> reaches the same items with 'omnifunc').
    vim.lsp.completion.get()
    -- (Headless Neovim draws no menu, so pumvisible() stays 0; the completion state is real.)
    h.wait(60000, 'the completion items', function()
      return #vim.fn.complete_info({ 'items' }).items > 0
    end)
    local items = vim.fn.complete_info({ 'items' }).items
    report.menu = vim.tbl_map(function(item)
      return { word = item.word, menu = item.menu, kind = item.kind }
    end, items)
    -- Select the item (unless 'completeopt' already did) and take it.
    if vim.fn.complete_info({ 'selected' }).selected < 0 then
      h.type_keys('<C-n>')
    end
    h.type_keys('<C-y>')
    h.wait(5000, 'the item to be inserted', function()
      return h.line() ~= report.line_before
    end)
    report.line_after = h.line()
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
