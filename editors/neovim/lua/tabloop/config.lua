--- Options of the tabloop Neovim plugin, with their defaults.
local M = {}

---@class tabloop.Keymaps
---@field accept string|false Accept the suggestion shown (falls back to the key itself).
---@field next string|false Show the next suggestion.
---@field prev string|false Show the previous suggestion.
---@field dismiss string|false Hide the suggestion shown.

---@class tabloop.Options
---@field keymaps tabloop.Keymaps Insert-mode keys, buffer-local where tabloop attaches; `false` disables one.
---@field settings table Server settings (camelCase, as in the README's table), e.g. `{ completion = { maxNewTokens = 32 } }`.
---@field telemetry boolean Whether tabloop may report telemetry (`telemetry.clientEnabled`).
---@field cmd? string[] The server command; default `tabloop serve --stdio`.
---@field search_results integer How many hits `:TabloopSearch` asks for.
---@field inline_completion boolean Ghost text where Neovim has it (0.12+); false: completion items instead.
---@field next_edit tabloop.NextEditOptions Next-edit suggestions.

---@class tabloop.NextEditOptions
---@field enabled boolean Ask for the next edit after a pause in typing; false also turns it off in the server (`nextEdit.enabled`).

---@type tabloop.Options
M.defaults = {
  keymaps = {
    accept = '<Tab>',
    next = '<M-]>',
    prev = '<M-[>',
    dismiss = '<C-]>',
  },
  settings = {},
  telemetry = true,
  cmd = nil,
  search_results = 20,
  inline_completion = true,
  next_edit = { enabled = true },
}

---@type tabloop.Options
M.options = vim.deepcopy(M.defaults)

--- The settings object sent to the server: the user's settings plus the telemetry switch.
---@return table
function M.server_settings()
  local settings = vim.deepcopy(M.options.settings)
  settings.telemetry = settings.telemetry or {}
  if settings.telemetry.clientEnabled == nil then
    settings.telemetry.clientEnabled = M.options.telemetry
  end
  if not M.options.next_edit.enabled then
    settings.nextEdit = vim.tbl_extend('keep', settings.nextEdit or {}, { enabled = false })
  end
  return settings
end

--- Whether suggestions come as ghost text: the user wants it and this Neovim has it.
---@return boolean
function M.use_inline()
  return M.options.inline_completion and vim.lsp.inline_completion ~= nil
end

return M
