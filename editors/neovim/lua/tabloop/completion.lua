--- Suggestions as completion items (Neovim 0.11's `vim.lsp.completion`, 0.10's 'omnifunc', or
--- `inline_completion = false`). Neovim inserts only the first word of a plain-text item's text
--- (its filter word); for a tabloop suggestion the whole text is the point, so once the item is
--- taken this puts the rest in. The item's `tabloop.accept` command still runs as usual.
local M = {}

---@return table? lsp.CompletionItem of the tabloop suggestion just taken
local function completed_suggestion()
  local completed = vim.v.completed_item
  local item = vim.tbl_get(completed or {}, 'user_data', 'nvim', 'lsp', 'completion_item')
  if type(item) ~= 'table' or type(item.command) ~= 'table' or item.command.command ~= 'tabloop.accept' then
    return nil
  end
  if item.insertTextFormat == 2 then
    return nil -- snippets are expanded whole by Neovim already
  end
  return item
end

---@param bufnr integer
function M.complete_done(bufnr)
  local item = completed_suggestion()
  if not item then
    return
  end
  local text = item.textEdit and item.textEdit.newText or item.insertText or item.label
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
    vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = true })
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
