-- Shared machinery of the Neovim scenarios: configuration and report files, a coroutine runner
-- inside Neovim's main loop (so keys fed with nvim_feedkeys are typed exactly as a user's would be:
-- mappings, insert mode, autocommands), waits that never block the loop, and the tabloop client.
--
-- A scenario is run as:
--   TABLOOP_TEST_NVIM_CONFIG=CONFIG.json TABLOOP_TEST_NVIM_REPORT=REPORT.json \
--     nvim --headless --clean -c 'luafile SCENARIO.lua'
-- CONFIG: { plugin, python, file, line, settings, timeout_ms, started_ns, cmd?, ... }
local M = {}

M.cfg = vim.json.decode(
  table.concat(vim.fn.readfile(vim.env.TABLOOP_TEST_NVIM_CONFIG), '\n'),
  { luanil = { object = true } } -- JSON null: absent, not vim.NIL (which is truthy)
)
-- The harness's CLOCK_MONOTONIC reading when it started nvim (uv.hrtime reads the same clock).
local started = M.cfg.started_ns or vim.uv.hrtime()
local report_path = vim.env.TABLOOP_TEST_NVIM_REPORT
M.report = { steps = {}, notifications = {}, timings_ms = {} }

---@type vim.lsp.Client
M.client = nil
---@type integer
M.bufnr = nil

local runner ---@type thread

function M.elapsed_ms()
  return (vim.uv.hrtime() - started) / 1e6
end

function M.write_report()
  vim.fn.writefile({ vim.json.encode(M.report) }, report_path)
end

local function fail(message)
  io.stderr:write(message, '\n')
  M.write_report()
  vim.cmd('cquit 1')
end

--- Yields to the main loop for `ms`, so typed keys, LSP messages and timers are processed.
function M.sleep(ms)
  vim.defer_fn(function()
    local ok, err = coroutine.resume(runner)
    if not ok then
      fail('session error: ' .. tostring(err))
    end
  end, ms)
  coroutine.yield()
end

function M.step(name, fn)
  local ok, err = xpcall(fn, debug.traceback)
  M.report.steps[#M.report.steps + 1] = { name = name, ok = ok, error = ok and vim.NIL or err }
  M.write_report()
  if not ok then
    fail(('step %s failed: %s'):format(name, err))
    coroutine.yield() -- never resumed: Neovim is exiting
  end
end

function M.wait(ms, what, cond)
  local deadline = vim.uv.now() + ms
  while not cond() do
    if vim.uv.now() > deadline then
      error(('timed out after %d ms waiting for %s'):format(ms, what), 2)
    end
    M.sleep(20)
  end
end

--- Types keys (through mappings) and lets Neovim process them.
function M.type_keys(keys)
  vim.api.nvim_feedkeys(vim.keycode(keys), 'mt', false)
  M.sleep(20)
end

--- A request to the tabloop server, waited for without blocking the main loop.
function M.request(method, params, timeout_ms)
  local answer
  M.client:request(method, params, function(err, result)
    answer = { err = err, result = result }
  end, M.bufnr)
  M.wait(timeout_ms or 60000, method, function()
    return answer ~= nil
  end)
  assert(not answer.err, vim.inspect(answer.err))
  return answer.result
end

function M.status()
  return M.request('tabloop/status', {})
end

function M.line()
  return vim.api.nvim_buf_get_lines(M.bufnr, M.cfg.line - 1, M.cfg.line, true)[1]
end

--- Loads the plugin from the checkout, opens the file, waits for the client; `opts` go to setup().
function M.start(opts)
  -- Neovim's LSP log: the server's stderr lands there as ERROR, window/logMessage by its type.
  vim.lsp.log.set_level(M.cfg.lsp_log_level or 'WARN')
  M.report.lsp_log = vim.lsp.log.get_filename()
  vim.opt.runtimepath:prepend(M.cfg.plugin)
  vim.cmd.runtime('plugin/tabloop.lua')
  require('tabloop').setup(vim.tbl_extend('force', {
    cmd = M.cfg.cmd or { M.cfg.python, '-m', 'lsp_server', '--stdio' },
    telemetry = false,
    settings = M.cfg.settings,
  }, opts or {}))
  vim.lsp.enable('tabloop')
  vim.cmd.edit(M.cfg.file)
  M.bufnr = vim.api.nvim_get_current_buf()
  M.wait(30000, 'the client to attach', function()
    local client = require('tabloop').clients(M.bufnr)[1]
    return client ~= nil and client.initialized
  end)
  M.client = require('tabloop').clients(M.bufnr)[1]
  M.report.timings_ms.attached = M.elapsed_ms()
  -- Record the notifications the plugin sends (test instrumentation only).
  local notify = M.client.notify
  M.client.notify = function(self, method, params)
    if method:match('^tabloop/') then
      M.report.notifications[#M.report.notifications + 1] = { method = method, params = params }
    end
    return notify(self, method, params)
  end
  M.report.keymaps = {}
  for _, m in ipairs(vim.api.nvim_buf_get_keymap(M.bufnr, 'i')) do
    if m.desc and m.desc:match('^tabloop') then
      M.report.keymaps[m.lhs] = m.desc
    end
  end
  M.report.clients = vim.tbl_map(function(c)
    return {
      id = c.id,
      root_dir = c.root_dir or vim.NIL,
      buffers = vim.tbl_map(vim.api.nvim_buf_get_name, vim.tbl_keys(c.attached_buffers)),
    }
  end, require('tabloop').clients())
end

function M.wait_ready()
  local state
  M.wait(180000, 'the model to load', function()
    state = M.status().model.state
    return state ~= 'loading'
  end)
  assert(state == 'ready', 'model state ' .. tostring(state))
  M.report.timings_ms.ready = M.elapsed_ms()
end

function M.stop()
  M.client:stop()
  M.wait(10000, 'the server to exit', function()
    return M.client:is_stopped()
  end)
end

--- Runs `scenario` as a coroutine in the main loop, with an overall time limit, then quits.
function M.run(scenario)
  vim.defer_fn(function()
    fail(('session timed out after %d ms'):format(M.cfg.timeout_ms))
  end, M.cfg.timeout_ms)
  runner = coroutine.create(function()
    scenario()
    M.write_report()
    vim.cmd('qa!')
  end)
  vim.schedule(function()
    local ok, err = coroutine.resume(runner)
    if not ok then
      fail('session error: ' .. tostring(err))
    end
  end)
end

return M
