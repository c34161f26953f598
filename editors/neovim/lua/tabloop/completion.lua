--- Suggestions as completion items (Neovim 0.11's `vim.lsp.completion`, 0.10's 'omnifunc', or
--- `inline_completion = false`). Neovim inserts only a plain-text item's word (here, via
--- `convert`, the suggestion's first line); for a tabloop suggestion the whole text is the point,
--- so once the item is taken this puts the rest in. Its `tabloop.accept` command runs as usual.
local protocol = require('tabloop.protocol')

local M = {}

--- Whether `item` (an lsp.CompletionItem) is a plain-text tabloop suggestion.
---@param item any
---@return boolean
local function is_suggestion(item)
  return type(item) == 'table'
    and type(item.command) == 'table'
    and item.command.command == protocol.ACCEPT_COMMAND
    and item.insertTextFormat ~= 2 -- snippets are expanded whole by Neovim already
end

---@param item table lsp.CompletionItem
---@return string
local function suggestion_text(item)
  return item.textEdit and item.textEdit.newText or item.insertText or item.label or ''
end

--- The word of a tabloop suggestion's complete-item (what Neovim inserts while the item is
--- selected): its first line, leading blanks included; for a text that starts with a line break,
--- its first non-blank line, trimmed. Never empty for a non-blank text, and never a line break
--- (Neovim would insert it as a NUL).
---
--- Neovim's own word for a plain-text item is `newText:match('^(%S*)')` (0.11, 0.12): empty for
--- a suggestion that starts with a space (`result =` + ` sep.join(kept)`), so selecting the item
--- shows nothing. Newer Neovim takes the whole first line, as this does.
---@param text string
---@return string
function M.word(text)
  local first = text:match('^[^\n]*')
  if first:find('%S') then
    return first
  end
  local line = text:match('[^\n]*%S[^\n]*')
  return line and vim.trim(line) or first
end

--- `convert` for `vim.lsp.completion.enable`: the complete-item fields Neovim merges into its own
--- for each item. Only tabloop suggestions change (their word, see `M.word`); other servers'
--- items get `{}`. Neovim keeps one `convert` per buffer (the first `enable()` call's): a user
--- with their own can merge this in, e.g.
--- `vim.tbl_extend('force', mine(item), require('tabloop.completion').convert(item))`.
---@param item table lsp.CompletionItem
---@return table
function M.convert(item)
  if not is_suggestion(item) then
    return {}
  end
  local word = M.word(suggestion_text(item))
  if word == '' then
    return {}
  end
  return { word = word }
end

---@return table? lsp.CompletionItem of the tabloop suggestion just taken
local function completed_suggestion()
  local completed = vim.v.completed_item
  local item = vim.tbl_get(completed or {}, 'user_data', 'nvim', 'lsp', 'completion_item')
  if not is_suggestion(item) then
    return nil
  end
  return item
end

---@param bufnr integer
function M.complete_done(bufnr)
  local item = completed_suggestion()
  if not item then
    return
  end
  -- Only a taken item (<C-y>): Neovim runs its command only then. Typing on or <Esc> with the
  -- item selected keeps its word and no more. (Without a reason, as from older Neovim, any.)
  local reason = (vim.v.event or {}).reason
  if reason ~= nil and reason ~= 'accept' then
    return
  end
  local text = suggestion_text(item)
  local word = vim.v.completed_item.word or ''
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  local line = vim.api.nvim_buf_get_lines(bufnr, row - 1, row, true)[1]
  local start = col - #word
  if start < 0 or line:sub(start + 1, col) ~= word or text == word then
    return
  end
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, row - 1, start, row - 1, col, lines)
  local last = #lines == 1 and start + #lines[1] or #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + #lines - 1, last })
end

---@param client vim.lsp.Client
---@param bufnr integer
function M.attach(client, bufnr)
  if vim.lsp.completion and vim.lsp.completion.enable then
    vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = true, convert = M.convert })
  end
  -- Neovim 0.10 and older: the same items reach 'omnifunc' (<C-x><C-o>), set by Neovim.
  vim.api.nvim_create_autocmd('CompleteDone', {
    group = vim.api.nvim_create_augroup('tabloop.completion.' .. bufnr, { clear = true }),
    buffer = bufnr,
    callback = function()
      M.complete_done(bufnr)
    end,
  })
end

return M
