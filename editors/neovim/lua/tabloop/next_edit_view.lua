--- How a next-edit prediction looks, with extmarks: deleted text highlighted
--- (`TabloopNextEditDelete`), inserted text as virtual text where it goes and as virtual lines
--- for the lines it adds (`TabloopNextEditInsert`), and, when the edit is off screen, a hint at the
--- end of the cursor's line that <Tab> jumps there (`TabloopNextEditJump`).
local M = {}

M.NS = vim.api.nvim_create_namespace('tabloop.next_edit')
M.JUMP_HINT = 'Tab: jump to the next edit'

--- Define the highlight groups (`default`, so a colorscheme or the user's own win).
function M.define_highlights()
  vim.api.nvim_set_hl(0, 'TabloopNextEditDelete', { default = true, link = 'DiffDelete' })
  vim.api.nvim_set_hl(0, 'TabloopNextEditInsert', { default = true, link = 'DiffAdd' })
  vim.api.nvim_set_hl(0, 'TabloopNextEditJump', { default = true, link = 'Comment' })
end

--- The (0-based) row and byte column of an LSP position in `bufnr`.
---@param bufnr integer
---@param position lsp.Position
---@param encoding string the client's offset encoding
---@return integer row, integer col
function M.byte_position(bufnr, position, encoding)
  local line = vim.api.nvim_buf_get_lines(bufnr, position.line, position.line + 1, false)[1] or ''
  local ok, col = pcall(vim.str_byteindex, line, encoding, position.character, false)
  return position.line, ok and col or #line
end

---@param lines string[]
---@return table[] virt_lines
local function virtual_lines(lines)
  return vim.tbl_map(function(line)
    return { { line, 'TabloopNextEditInsert' } }
  end, lines)
end

--- Marks for text inserted at (row, col): whole lines as virtual lines (above the line when the
--- text goes in at its start and ends with a line break, below it when the text goes in at its
--- end and starts with one), otherwise the first line inline and the rest as virtual lines below.
---@param bufnr integer
---@param row integer
---@param col integer
---@param text string
local function draw_insertion(bufnr, row, col, text)
  local lines = vim.split(text, '\n', { plain = true })
  local line_length = #(vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or '')
  if #lines > 1 and col == 0 and lines[#lines] == '' then
    vim.api.nvim_buf_set_extmark(bufnr, M.NS, row, 0, {
      virt_lines = virtual_lines(vim.list_slice(lines, 1, #lines - 1)),
      virt_lines_above = true,
    })
  elseif #lines > 1 and col == line_length and lines[1] == '' then
    vim.api.nvim_buf_set_extmark(bufnr, M.NS, row, col, { virt_lines = virtual_lines(vim.list_slice(lines, 2)) })
  else
    local mark = { virt_text = { { lines[1], 'TabloopNextEditInsert' } }, virt_text_pos = 'inline' }
    if #lines > 1 then
      mark.virt_lines = virtual_lines(vim.list_slice(lines, 2))
    end
    vim.api.nvim_buf_set_extmark(bufnr, M.NS, row, col, mark)
  end
end

--- Draw the items of a prediction in `bufnr`; `jump` adds the hint at the end of row `jump.row`.
---@param bufnr integer
---@param items table[] the prediction's items (LSP ranges and texts)
---@param encoding string
---@param jump? { row: integer, target: integer } the cursor's row and the edit's (0-based)
function M.draw(bufnr, items, encoding, jump)
  M.clear(bufnr)
  for _, item in ipairs(items) do
    local start_row, start_col = M.byte_position(bufnr, item.range.start, encoding)
    local end_row, end_col = M.byte_position(bufnr, item.range['end'], encoding)
    if start_row ~= end_row or start_col ~= end_col then
      vim.api.nvim_buf_set_extmark(bufnr, M.NS, start_row, start_col, {
        end_row = end_row,
        end_col = end_col,
        hl_group = 'TabloopNextEditDelete',
      })
    end
    if item.text ~= '' then
      draw_insertion(bufnr, end_row, end_col, item.text)
    end
  end
  if jump then
    local hint = ('⇥ %s (line %d)'):format(M.JUMP_HINT, jump.target + 1)
    vim.api.nvim_buf_set_extmark(bufnr, M.NS, jump.row, 0, {
      virt_text = { { hint, 'TabloopNextEditJump' } },
      virt_text_pos = 'eol',
    })
  end
end

---@param bufnr integer
function M.clear(bufnr)
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, M.NS, 0, -1)
  end
end

return M
