-- Next edits in Neovim 0.12 against the real tabloop server with a scripted model: renaming a
-- parameter brings the matching change, drawn with extmarks; <C-]> rejects it, an explicit request
-- brings it back and <Tab> applies it; the server counts each outcome. Writes a JSON report for
-- tests/editors/test_neovim_next_edit.py.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))
local report = h.report

local NS = vim.api.nvim_create_namespace('tabloop.next_edit')
local next_edit -- the plugin's module, once h.start() has put the plugin on 'runtimepath'

local function marks()
  return #vim.api.nvim_buf_get_extmarks(h.bufnr, NS, 0, -1, {})
end

local function wait_shown(what)
  h.wait(60000, what, function()
    return next_edit.visible(h.bufnr) ~= nil and marks() > 0
  end)
end

local function wait_counted(field, count)
  h.wait(10000, 'the server to count ' .. field, function()
    return h.status().nextEdit[field] == count
  end)
end

h.run(function()
  h.step('start', function()
    h.start()
    next_edit = require('tabloop.next_edit')
    report.capabilities = h.client.server_capabilities.experimental
  end)

  h.step('ready', h.wait_ready)

  h.step('rename', function()
    -- `cw` over `width` in "def area(width, height):", then `w`.
    vim.api.nvim_win_set_cursor(0, { 1, 9 })
    h.type_keys('cw')
    h.type_keys('w')
    report.renamed = vim.api.nvim_buf_get_lines(h.bufnr, 0, 1, true)[1]
    wait_shown('the prediction')
    report.items = next_edit.visible(h.bufnr).items
    h.type_keys('<C-]>')
    wait_counted('rejected', 1)
  end)

  h.step('accept', function()
    assert(next_edit.request(h.bufnr, 1), 'no request went out')
    wait_shown('the prediction again')
    h.type_keys('<Tab>')
    h.wait(5000, 'the edit applied', function()
      return next_edit.visible(h.bufnr) == nil and marks() == 0
    end)
    report.lines = vim.api.nvim_buf_get_lines(h.bufnr, 0, -1, true)
    wait_counted('accepted', 1)
    report.status = h.status().nextEdit
    h.type_keys('<Esc>')
  end)

  h.step('stop', h.stop)
end)
