-- Neovim 0.12 cycling through the candidates of an explicit request with <M-]> and <M-[>, against
-- the server running the committed tiny model (the scripted model's HTTP runner offers one
-- candidate). Records the server's answers as Neovim received them, and after each key the
-- ghost text Neovim draws with its own "(index/count)" hint and the tabloop/didShow notifications
-- sent, for tests/editors/test_neovim.py.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))
local cfg, report = h.cfg, h.report

local NS = vim.api.nvim_create_namespace('nvim.lsp.inline_completion')
local METHOD = 'textDocument/inlineCompletion'
local SUGGESTION_TIMEOUT_MS = cfg.suggestion_timeout_ms or 60000

--- The first line Neovim draws and its index hint (`ComplHintMore`), or nil.
local function drawn(bufnr)
  local marks = vim.api.nvim_buf_get_extmarks(bufnr, NS, 0, -1, { details = true })
  if #marks == 0 then
    return nil
  end
  local text, hint = {}, nil
  for _, chunk in ipairs(marks[1][4].virt_text or {}) do
    if chunk[2] == 'ComplHintMore' then
      hint = chunk[1]
    else
      text[#text + 1] = chunk[1]
    end
  end
  return { text = table.concat(text), hint = hint or vim.NIL }
end

local function shows()
  local ids = {}
  for _, n in ipairs(report.notifications) do
    if n.method == 'tabloop/didShow' then
      ids[#ids + 1] = n.params.decisionId
    end
  end
  return ids
end

h.run(function()
  h.step('start', function()
    h.start()
    -- Record every answer as Neovim receives it (outside the plugin's own watch).
    report.answers = {}
    report.requests = 0
    local request = h.client.request
    -- The plugin's explicit request reuses the handler Neovim passed (here, wrapped): unwrap it.
    local unwrapped = setmetatable({}, { __mode = 'k' })
    h.client.request = function(self, method, params, handler, bufnr)
      if method ~= METHOD or not handler then
        return request(self, method, params, handler, bufnr)
      end
      report.requests = report.requests + 1
      handler = unwrapped[handler] or handler
      local recording
      recording = function(err, result, ctx, config)
        local items = {}
        for _, item in ipairs(result and (result.items or result) or {}) do
          items[#items + 1] = {
            text = item.insertText,
            decision = item.command and item.command.arguments and item.command.arguments[1] or vim.NIL,
          }
        end
        report.answers[#report.answers + 1] = { trigger = params.context.triggerKind, items = items }
        handler(err, result, ctx, config)
      end
      unwrapped[recording] = handler
      return request(self, method, params, recording, bufnr)
    end
  end)

  h.step('ready', h.wait_ready)

  h.step('typing', function()
    vim.api.nvim_win_set_cursor(0, { cfg.line, 0 })
    h.type_keys('A')
    h.wait(SUGGESTION_TIMEOUT_MS, 'the answer to typing', function()
      return #report.answers >= 1
    end)
    -- Entering insert mode and moving the cursor may each ask (debounced): let them all answer.
    h.sleep(500)
    h.wait(SUGGESTION_TIMEOUT_MS, 'every answer to typing', function()
      return #report.answers == report.requests
    end)
    report.after_typing = { drawn = drawn(h.bufnr) or vim.NIL, shows = shows() }
  end)

  h.step('cycle', function()
    report.cycle = {}
    -- The first key asks for every candidate and moves to the second; then around the end, and
    -- back around the start.
    for i, key in ipairs({ '<M-]>', '<M-]>', '<M-]>', '<M-]>', '<M-[>', '<M-[>', '<M-[>' }) do
      local answers = #report.answers
      h.type_keys(key)
      if i == 1 then
        h.wait(SUGGESTION_TIMEOUT_MS, 'the explicit answer', function()
          return #report.answers > answers
        end)
        local items = report.answers[#report.answers].items
        assert(#items >= 2, ('the explicit request got %d candidate(s): %s'):format(#items, vim.inspect(items)))
      end
      -- The plugin moves once the answer is drawn: wait for Neovim's index hint to change.
      local before = i > 1 and report.cycle[i - 1].drawn.hint or vim.NIL
      h.wait(5000, 'the index hint to change', function()
        local now = drawn(h.bufnr)
        return now ~= nil and now.hint ~= vim.NIL and now.hint ~= before
      end)
      report.cycle[#report.cycle + 1] = { key = key, drawn = drawn(h.bufnr), shows = shows() }
    end
  end)

  h.step('stop', function()
    h.type_keys('<Esc>')
    h.stop()
  end)
end)
