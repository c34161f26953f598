if vim.g.loaded_tabloop then
  return
end
vim.g.loaded_tabloop = true

vim.api.nvim_create_user_command('TabloopSearch', function(cmd)
  local commands = require('tabloop.commands')
  if cmd.args ~= '' then
    commands.search(cmd.args)
    return
  end
  vim.ui.input({ prompt = 'tabloop search: ' }, function(query)
    if query and vim.trim(query) ~= '' then
      commands.search(query)
    end
  end)
end, { nargs = '*', desc = 'tabloop: search the codebase by meaning' })

vim.api.nvim_create_user_command('TabloopStatus', function()
  require('tabloop.commands').show_status()
end, { desc = 'tabloop: model, index, policy and decision counts' })

-- Keep the statusline string fresh while the server reports progress (model load, indexing).
vim.api.nvim_create_autocmd('LspProgress', {
  group = vim.api.nvim_create_augroup('tabloop.progress', { clear = true }),
  callback = function(ev)
    local client = vim.lsp.get_client_by_id(ev.data.client_id)
    if client and client.name == 'tabloop' then
      require('tabloop').refresh_status()
    end
  end,
})
