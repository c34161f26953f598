-- Drives the tabloop plugin in a real headless Neovim against the real server, and writes what
-- happened to a JSON report for tests/editors/test_neovim.py.
-- Usage: TABLOOP_TEST_NVIM_CONFIG=CONFIG.json TABLOOP_TEST_NVIM_REPORT=REPORT.json \
--          nvim --headless --clean -c 'luafile session.lua'
-- CONFIG: { plugin, python, file, line, settings, search_query?, timeout_ms }
-- It runs as a coroutine inside Neovim's main loop, so keys fed with nvim_feedkeys are typed
-- exactly as a user's would be (mappings, insert mode, autocommands), between its steps.
local cfg = vim.json.decode(table.concat(vim.fn.readfile(vim.env.TABLOOP_TEST_NVIM_CONFIG), '\n'))
-- The harness's CLOCK_MONOTONIC reading when it started nvim (uv.hrtime reads the same clock).
local started = cfg.started_ns or vim.uv.hrtime()
local report_path = vim.env.TABLOOP_TEST_NVIM_REPORT
local report = { steps = {}, notifications = {}, timings_ms = {} }

local function elapsed_ms()
  return (vim.uv.hrtime() - started) / 1e6
end

local function write_report()
  vim.fn.writefile({ vim.json.encode(report) }, report_path)
end

local function fail(message)
  io.stderr:write(message, '\n')
  write_report()
  vim.cmd('cquit 1')
end

local runner ---@type thread

--- Yields to the main loop for `ms`, so typed keys, LSP messages and timers are processed.
local function sleep(ms)
  vim.defer_fn(function()
    local ok, err = coroutine.resume(runner)
    if not ok then
      fail('session error: ' .. tostring(err))
    end
  end, ms)
  coroutine.yield()
end

local function step(name, fn)
  local ok, err = xpcall(fn, debug.traceback)
  report.steps[#report.steps + 1] = { name = name, ok = ok, error = ok and vim.NIL or err }
  write_report()
  if not ok then
    fail(('step %s failed: %s'):format(name, err))
    coroutine.yield() -- never resumed: Neovim is exiting
  end
end

local function wait(ms, what, cond)
  local deadline = vim.uv.now() + ms
  while not cond() do
    if vim.uv.now() > deadline then
      error(('timed out after %d ms waiting for %s'):format(ms, what), 2)
    end
    sleep(20)
  end
end

local NS = vim.api.nvim_create_namespace('nvim.lsp.inline_completion')
local function ghost_text(bufnr)
  local marks = vim.api.nvim_buf_get_extmarks(bufnr, NS, 0, -1, { details = true })
  if #marks == 0 then
    return nil
  end
  local details = marks[1][4]
  local chunks = {}
  for _, chunk in ipairs(details.virt_text or {}) do
    chunks[#chunks + 1] = chunk[1]
  end
  for _, line in ipairs(details.virt_lines or {}) do
    local parts = {}
    for _, chunk in ipairs(line) do
      parts[#parts + 1] = chunk[1]
    end
    chunks[#chunks + 1] = '\n' .. table.concat(parts)
  end
  return table.concat(chunks)
end

local client ---@type vim.lsp.Client
local bufnr ---@type integer

--- `tabloop/status`, waited for without blocking the main loop.
local function status()
  local answer
  client:request('tabloop/status', {}, function(err, result)
    answer = { err = err, result = result }
  end, bufnr)
  wait(60000, 'tabloop/status', function()
    return answer ~= nil
  end)
  assert(not answer.err, vim.inspect(answer.err))
  return answer.result
end

--- Types keys (through mappings) and lets Neovim process them.
local function type_keys(keys)
  vim.api.nvim_feedkeys(vim.keycode(keys), 'mt', false)
  sleep(20)
end

local function session()
  step('start', function()
    vim.opt.runtimepath:prepend(cfg.plugin)
    vim.cmd.runtime('plugin/tabloop.lua')
    require('tabloop').setup({
      cmd = { cfg.python, '-m', 'lsp_server', '--stdio' },
      telemetry = false,
      settings = cfg.settings,
    })
    vim.lsp.enable('tabloop')
    vim.cmd.edit(cfg.file)
    bufnr = vim.api.nvim_get_current_buf()
    wait(30000, 'the client to attach', function()
      return require('tabloop').clients(bufnr)[1] ~= nil and require('tabloop').clients(bufnr)[1].initialized
    end)
    client = require('tabloop').clients(bufnr)[1]
    report.timings_ms.attached = elapsed_ms()
    -- Record the notifications the plugin sends (test instrumentation only).
    local notify = client.notify
    client.notify = function(self, method, params)
      if method:match('^tabloop/') then
        report.notifications[#report.notifications + 1] = { method = method, params = params }
      end
      return notify(self, method, params)
    end
    report.keymaps = {}
    for _, m in ipairs(vim.api.nvim_buf_get_keymap(bufnr, 'i')) do
      if m.desc and m.desc:match('^tabloop') then
        report.keymaps[m.lhs] = m.desc
      end
    end
  end)

  step('ready', function()
    local state
    wait(180000, 'the model to load', function()
      state = status().model.state
      return state ~= 'loading'
    end)
    assert(state == 'ready', 'model state ' .. tostring(state))
    report.timings_ms.ready = elapsed_ms()
  end)

  step('ghost_text', function()
    vim.api.nvim_win_set_cursor(0, { cfg.line, 0 })
    local shown_at = vim.uv.hrtime()
    type_keys('A')
    assert(vim.api.nvim_get_mode().mode == 'i', 'not in insert mode: ' .. vim.api.nvim_get_mode().mode)
    wait(60000, 'ghost text', function()
      return ghost_text(bufnr) ~= nil
    end)
    report.timings_ms.first_ghost_text = elapsed_ms()
    report.timings_ms.insert_to_ghost_text = (vim.uv.hrtime() - shown_at) / 1e6
    report.ghost_text = ghost_text(bufnr)
    report.line_before = vim.api.nvim_buf_get_lines(bufnr, cfg.line - 1, cfg.line, true)[1]
  end)

  step('accept', function()
    local before = status().decisions.accepted
    type_keys('<Tab>')
    wait(5000, 'the suggestion to be inserted', function()
      return vim.api.nvim_buf_get_lines(bufnr, cfg.line - 1, cfg.line, true)[1] ~= report.line_before
    end)
    report.line_after = vim.api.nvim_buf_get_lines(bufnr, cfg.line - 1, cfg.line, true)[1]
    report.buffer_after_accept = table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, true), '\n')
    wait(10000, 'the server to record the acceptance', function()
      return status().decisions.accepted == before + 1
    end)
    report.status_after_accept = status()
  end)

  step('dismiss', function()
    -- A new line, a new suggestion; then dismiss it.
    type_keys('<CR>')
    wait(60000, 'a second ghost text', function()
      return ghost_text(bufnr) ~= nil
    end)
    report.second_ghost_text = ghost_text(bufnr)
    local lines_before = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)
    type_keys('<C-]>')
    wait(2000, 'the ghost text to go', function()
      return ghost_text(bufnr) == nil
    end)
    -- Dismissed means not inserted.
    assert(vim.deep_equal(lines_before, vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)), 'dismiss changed the buffer')
    type_keys('<Esc>')
  end)

  if cfg.search_query then
    step('search', function()
      local picked, done
      vim.ui.select = function(items, opts, on_choice)
        report.search_items = vim.tbl_map(opts.format_item, items)
        on_choice(items[1], 1)
      end
      -- The index builds in the background: ask again until it answers with hits.
      wait(180000, 'search results', function()
        if done == nil then
          done = false
          require('tabloop.commands').search(cfg.search_query, function(hit)
            picked, done = hit, true
          end)
        elseif done and not picked then
          done = nil
          sleep(500)
        end
        return picked ~= nil
      end)
      report.search_hit = picked
      report.search_jump = { file = vim.api.nvim_buf_get_name(0), cursor = vim.api.nvim_win_get_cursor(0) }
    end)
  end

  step('status_command', function()
    local messages = {}
    vim.notify = function(msg)
      messages[#messages + 1] = msg
    end
    vim.cmd('TabloopStatus')
    wait(10000, ':TabloopStatus output', function()
      return #messages > 0
    end)
    report.status_message = messages[1]
    report.clients = vim.tbl_map(function(c)
      return {
        id = c.id,
        root_dir = c.root_dir or vim.NIL,
        buffers = vim.tbl_map(vim.api.nvim_buf_get_name, vim.tbl_keys(c.attached_buffers)),
      }
    end, require('tabloop').clients())
    report.statusline = require('tabloop').statusline()
  end)

  step('stop', function()
    client:stop()
    wait(10000, 'the server to exit', function()
      return client:is_stopped()
    end)
  end)
  write_report()
    vim.cmd('qa!')
end

-- Whatever happens, do not hang the test run.
vim.defer_fn(function()
  fail(('session timed out after %d ms'):format(cfg.timeout_ms))
end, cfg.timeout_ms)
runner = coroutine.create(session)
vim.schedule(function()
  local ok, err = coroutine.resume(runner)
  if not ok then
    fail('session error: ' .. tostring(err))
  end
end)
