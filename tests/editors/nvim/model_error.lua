-- A server whose model cannot load: the error must reach Neovim's LSP log as an error. Writes a
-- JSON report for tests/editors/test_neovim.py.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))

h.run(function()
  h.step('start', function()
    h.start()
  end)
  h.step('model_error', function()
    local state
    h.wait(180000, 'the model to fail', function()
      state = h.status().model.state
      return state ~= 'loading'
    end)
    h.report.model_state = state
  end)
  h.step('stop', h.stop)
end)
