@echo off
if "%RVM%"=="" (rvm dap %*) else (%RVM% dap %*)
