--- `:TabloopSearch` and `:TabloopStatus`.
local config = require('tabloop.config')
local protocol = require('tabloop.protocol')
local tabloop = require('tabloop')

local M = {}

---@param hit table { uri, range, score, preview }
---@return string
function M.format_hit(hit)
  local path = vim.fn.fnamemodify(vim.uri_to_fname(hit.uri), ':~:.')
  local preview = vim.trim((hit.preview or ''):gsub('%s+', ' '))
  if #preview > 80 then
    preview = preview:sub(1, 77) .. '...'
  end
  return ('%s:%d  %.2f  %s'):format(path, hit.range.start.line + 1, hit.score or 0, preview)
end

--- Search the codebase by meaning and jump to the hit picked.
---@param query string
---@param on_done? fun(hit: table?) called after the jump (or with nil when nothing was picked)
function M.search(query, on_done)
  on_done = on_done or function() end
  local bufnr = vim.api.nvim_get_current_buf()
  local client = tabloop.clients(bufnr)[1] or tabloop.clients()[1]
  if not client then
    vim.notify('tabloop is not running', vim.log.levels.WARN)
    return on_done(nil)
  end
  local params = { query = query, k = config.options.search_results }
  client:request(protocol.SEARCH_REQUEST, params, function(err, hits)
    if err then
      vim.notify('tabloop search failed: ' .. err.message, vim.log.levels.ERROR)
      return on_done(nil)
    end
    if not hits or #hits == 0 then
      vim.notify(('tabloop: nothing found for "%s"'):format(query), vim.log.levels.INFO)
      return on_done(nil)
    end
    table.sort(hits, function(a, b)
      return (a.score or 0) > (b.score or 0)
    end)
    vim.ui.select(hits, {
      prompt = ('tabloop: %s'):format(query),
      format_item = M.format_hit,
      kind = 'tabloop.search',
    }, function(hit)
      if hit then
        vim.lsp.util.show_document({ uri = hit.uri, range = hit.range }, client.offset_encoding, { focus = true })
      end
      on_done(hit)
    end)
  end, bufnr)
end

---@param status table
---@return string[]
function M.status_lines(status)
  local model = status.model or {}
  local decisions = status.decisions or {}
  local lines = {
    ('tabloop %s'):format(status.version or ''),
    ('model:     %s %s%s'):format(
      model.state or '?',
      model.modelId or '',
      (model.error and model.error ~= '') and (' (' .. model.error .. ')') or ''
    ),
    ('policy:    %s'):format((status.policy or {}).version or 'none'),
    ('telemetry: %s'):format((status.telemetry or {}).level or '?'),
    ('decisions: shown %d, accepted %d'):format(decisions.shown or 0, decisions.accepted or 0),
  }
  local index = status.index
  if index then
    local parts = {}
    for _, key in ipairs({ 'state', 'files', 'chunks', 'done', 'total', 'error' }) do
      local value = index[key]
      if value ~= nil and value ~= vim.NIL and value ~= '' then
        table.insert(parts, ('%s %s'):format(key, tostring(value)))
      end
    end
    table.insert(lines, 'index:     ' .. table.concat(parts, ', '))
  end
  local training = status.training
  if type(training) == 'table' then
    table.insert(lines, 'training:  ' .. M.training_summary(training))
  end
  return lines
end

--- The background training of the next adapter: its state, step or reason, and the last run.
---@param training table
---@return string
function M.training_summary(training)
  local function given(value)
    return value ~= nil and value ~= vim.NIL and value ~= ''
  end
  local text = tostring(training.state or '?')
  local run = training.run
  if type(run) == 'table' and given(run.step) then
    text = text .. (' (step %s)'):format(tostring(run.step))
  elseif given(training.reason) then
    text = text .. (training.state == 'waiting' and ' for ' or ' (') .. tostring(training.reason)
    text = text .. (training.state == 'waiting' and '' or ')')
  end
  local last = training.lastRun
  if type(last) == 'table' and given(last.outcome) then
    text = text .. '; last run ' .. tostring(last.outcome)
    if given(last.version) then
      text = text .. ' ' .. tostring(last.version)
    end
  end
  return text
end

function M.show_status()
  tabloop.status(function(err, status)
    if err or not status then
      vim.notify('tabloop: ' .. (err and err.message or 'no status'), vim.log.levels.WARN)
      return
    end
    tabloop.last_status_line = tabloop.format_status(status)
    vim.notify(table.concat(M.status_lines(status), '\n'), vim.log.levels.INFO)
  end)
end

return M
