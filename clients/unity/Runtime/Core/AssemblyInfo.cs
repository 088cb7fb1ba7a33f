using System.Runtime.CompilerServices;

// The C# tests (tests/clients/unity) check the JSON mapping of requests directly.
[assembly: InternalsVisibleTo("Xlm.Sidecar.Tests")]
