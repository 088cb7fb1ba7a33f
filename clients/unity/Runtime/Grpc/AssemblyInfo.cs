using System.Runtime.CompilerServices;

// The C# tests (tests/clients/unity) check the protobuf codec against Python's protobuf.
[assembly: InternalsVisibleTo("Xlm.Sidecar.Tests")]
