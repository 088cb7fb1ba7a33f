# Rebuild llama-cpp-python 0.3.36 with llama.cpp's CUDA backend, in the venv that runs the daemon.
#
#   powershell -ExecutionPolicy Bypass -File deploy\cuda\build_windows.ps1                  # native
#   powershell -ExecutionPolicy Bypass -File deploy\cuda\build_windows.ps1 -Arch "86;89;120"
#
# Run from a "Developer PowerShell for VS 2022" (MSVC on PATH) with the CUDA toolkit installed
# (its installer adds the Visual Studio integration CMake needs) and CMake 3.21+.
# -Python: the venv's python (default .venv\Scripts\python.exe). -Source: an unpacked
# llama-cpp-python 0.3.36 sdist for machines without PyPI (scikit-build-core and cmake must then
# be in the venv). -PortableCpu: build for any x86-64 CPU (-DGGML_NATIVE=off).
param(
    [string]$Arch = "native",
    [string]$Python = ".venv\Scripts\python.exe",
    [string]$Source = "",
    [switch]$PortableCpu
)
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..\..")

if (-not (Get-Command nvcc -ErrorAction SilentlyContinue) -and -not $env:CUDA_PATH) {
    Write-Error "nvcc not found: install the CUDA toolkit (it sets CUDA_PATH)"
    exit 2
}
if (-not (Get-Command cl -ErrorAction SilentlyContinue)) {
    Write-Error "cl.exe not found: run this from a Developer PowerShell for Visual Studio"
    exit 2
}

$cmakeArgs = "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$Arch"
if ($PortableCpu) { $cmakeArgs += " -DGGML_NATIVE=off" }
$env:CMAKE_ARGS = $cmakeArgs
$env:CMAKE_BUILD_PARALLEL_LEVEL = "$([Environment]::ProcessorCount)"
Write-Host "building llama-cpp-python with CMAKE_ARGS=`"$cmakeArgs`""

$started = Get-Date
if ($Source) {
    & $Python -m pip install --force-reinstall --no-deps --no-build-isolation --no-cache-dir $Source
} else {
    & $Python -m pip install --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==0.3.36"
}
if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }

$lib = & $Python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llama_cpp'); print(pathlib.Path(next(iter(s.submodule_search_locations))) / 'lib')"
if (-not (Get-ChildItem -Path $lib -Filter "ggml-cuda*.dll" -ErrorAction SilentlyContinue)) {
    Write-Error "the build finished but $lib has no ggml-cuda.dll: CUDA was not enabled"
    exit 1
}
$took = [int]((Get-Date) - $started).TotalSeconds
Write-Host "llama-cpp-python with CUDA in $took s ($lib)"
# A frozen build made from this venv (deploy\build_frozen.py) needs the CUDA runtime DLLs that
# ggml-cuda.dll links against (cudart64_*, cublas64_*, cublasLt64_*): see deploy\README.md.
& $Python -m sidecar profile --quick | Out-Null
if ($LASTEXITCODE -ne 0) { Write-Warning "the quick profile failed; the daemon will retry it at start-up" }
