# Set everything up (first time only takes a while) and start Headroom in the tray (Windows).
$ErrorActionPreference = "Stop"
Set-Location (Split-Path -Parent $PSScriptRoot)
$python = (Get-Command py -ErrorAction SilentlyContinue)
if ($python) { $py = @("py", "-3") } else { $py = @("python") }
if (-not (Test-Path ".venv\Scripts\python.exe")) {
    & $py[0] $py[1..($py.Length - 1)] -m venv .venv
    if ($LASTEXITCODE -ne 0) { Write-Error "setup: could not create .venv (is Python 3.9+ installed?)" }
}
& .venv\Scripts\python.exe -m pip install -q --upgrade pip
& .venv\Scripts\python.exe -m pip install -q -e .
if ($LASTEXITCODE -ne 0) { Write-Error "setup: pip install failed" }
& .venv\Scripts\headroom.exe @args
