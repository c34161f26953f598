-- Neovim 0.12 with native inline completion: ghost text appears while typing, <Tab> accepts it
-- (and the server records the acceptance), <C-]> dismisses the next one, :TabloopSearch jumps to
-- a hit, :TabloopStatus reports. Writes a JSON report for tests/editors/test_neovim.py.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))
local cfg, report = h.cfg, h.report

local NS = vim.api.nvim_create_namespace('nvim.lsp.inline_completion')
-- How long one suggestion may take (a large model on a busy CPU needs more than the tiny one).
local SUGGESTION_TIMEOUT_MS = cfg.suggestion_timeout_ms or 60000

--- The ghost text drawn in `bufnr` (inline text, then virtual lines), or nil.
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

h.run(function()
  h.step('start', function()
    h.start()
  end)

  h.step('ready', h.wait_ready)

  h.step('ghost_text', function()
    vim.api.nvim_win_set_cursor(0, { cfg.line, 0 })
    local typed_at = vim.uv.hrtime()
    h.type_keys('A')
    assert(vim.api.nvim_get_mode().mode == 'i', 'not in insert mode: ' .. vim.api.nvim_get_mode().mode)
    h.wait(SUGGESTION_TIMEOUT_MS, 'ghost text', function()
      return ghost_text(h.bufnr) ~= nil
    end)
    report.timings_ms.first_ghost_text = h.elapsed_ms()
    report.timings_ms.insert_to_ghost_text = (vim.uv.hrtime() - typed_at) / 1e6
    report.ghost_text = ghost_text(h.bufnr)
    report.line_before = h.line()
  end)

  h.step('accept', function()
    local before = h.status().decisions.accepted
    h.type_keys('<Tab>')
    h.wait(5000, 'the suggestion to be inserted', function()
      return h.line() ~= report.line_before
    end)
    report.line_after = h.line()
    h.wait(10000, 'the server to record the acceptance', function()
      return h.status().decisions.accepted == before + 1
    end)
    report.status_after_accept = h.status()
  end)

  h.step('dismiss', function()
    -- A new line, a new suggestion; then dismiss it.
    h.type_keys('<CR>')
    h.wait(SUGGESTION_TIMEOUT_MS, 'a second ghost text', function()
      return ghost_text(h.bufnr) ~= nil
    end)
    report.second_ghost_text = ghost_text(h.bufnr)
    local lines_before = vim.api.nvim_buf_get_lines(h.bufnr, 0, -1, true)
    h.type_keys('<C-]>')
    h.wait(2000, 'the ghost text to go', function()
      return ghost_text(h.bufnr) == nil
    end)
    assert(vim.deep_equal(lines_before, vim.api.nvim_buf_get_lines(h.bufnr, 0, -1, true)), 'dismiss changed the buffer')
    h.type_keys('<Esc>')
  end)

  if cfg.search_query then
    h.step('search', function()
      local picked, done
      vim.ui.select = function(items, opts, on_choice)
        report.search_items = vim.tbl_map(opts.format_item, items)
        on_choice(items[1], 1)
      end
      -- The index builds in the background: search once it has read the whole workspace (a
      -- search while it is still reading could only find the files read so far).
      local index_state
      h.wait(180000, 'index ready', function()
        if index_state == nil then
          index_state = false
          require('tabloop').status(function(_, status)
            local index = status and status.index or {}
            if index.state == 'ready' and (index.queued or 0) == 0 then
              index_state = true
            else
              vim.defer_fn(function() index_state = nil end, 200) -- ask again a little later
            end
          end)
        end
        return index_state == true
      end)
      h.wait(180000, 'search results', function()
        if done == nil then
          done = false
          require('tabloop.commands').search(cfg.search_query, function(hit)
            picked, done = hit, true
          end)
        elseif done and not picked then
          done = nil
          h.sleep(500)
        end
        return picked ~= nil
      end)
      report.search_hit = picked
      report.search_jump = { file = vim.api.nvim_buf_get_name(0), cursor = vim.api.nvim_win_get_cursor(0) }
    end)
  end

  h.step('status_command', function()
    local messages = {}
    vim.notify = function(msg)
      messages[#messages + 1] = msg
    end
    vim.cmd('TabloopStatus')
    h.wait(10000, ':TabloopStatus output', function()
      return #messages > 0
    end)
    report.status_message = messages[1]
    report.statusline = require('tabloop').statusline()
  end)

  h.step('stop', h.stop)
end)
