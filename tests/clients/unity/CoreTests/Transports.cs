using System;
using System.Threading;

namespace Xlm.Sidecar.Tests
{
    public static partial class Env
    {
        /// <summary>XLM_TEST_TRANSPORT=grpc runs the client tests over gRPC (the .NET Core build).</summary>
        public static bool Grpc { get { return Environment.GetEnvironmentVariable("XLM_TEST_TRANSPORT") == "grpc"; } }

        /// <summary>The transport under test, to the test daemon, with `token`.</summary>
        public static ISidecarTransport Transport(string token)
        {
            return Grpc ? Transports.Grpc(Get("XLM_TEST_GRPC"), token) : new WebSocketTransport(WebSocketAddress, token);
        }

        /// <summary>The transport under test, to a port where nothing listens.</summary>
        public static ISidecarTransport Unreachable(string token)
        {
            return Grpc ? Transports.Grpc("127.0.0.1:9", token) : new WebSocketTransport("ws://127.0.0.1:9", token);
        }

        public static SidecarClient Client(string token)
        {
            return new SidecarClient(Transport(token), SynchronizationContext.Current);
        }
    }

    /// <summary>The gRPC transport where this program is built with it (-define:XLM_GRPC, the .NET Core
    /// build: Mono's HttpClient has no HTTP/2).</summary>
    public static class Transports
    {
        public static ISidecarTransport Grpc(string address, string token)
        {
#if XLM_GRPC
            Xlm.Sidecar.Grpc.GrpcTransport.EnableCleartextHttp2();
            return new Xlm.Sidecar.Grpc.GrpcTransport(address, token, new System.Net.Http.SocketsHttpHandler());
#else
            throw new AssertionFailed("this test program was built without the gRPC transport (XLM_GRPC)");
#endif
        }

        /// <summary>A message in the gRPC codec's bytes, base64; null where this program has no codec (Mono).</summary>
        public static string EncodeOrNull(string type, JsonObject json)
        {
#if XLM_GRPC
            return Convert.ToBase64String(Xlm.Sidecar.Grpc.ProtoSchema.Encode(type, json));
#else
            return null;
#endif
        }

        /// <summary>`--proto-encode TYPE` reads JSON on stdin and writes the protobuf bytes in base64;
        /// `--proto-decode TYPE` the other way. pytest checks both against Python's protobuf.</summary>
        public static int ProtoTool(string[] args)
        {
#if XLM_GRPC
            var input = Console.In.ReadToEnd().Trim();
            if (args[0] == "--proto-encode")
            {
                var bytes = Xlm.Sidecar.Grpc.ProtoSchema.Encode(args[1], Json.ParseObject(input));
                Console.WriteLine(Convert.ToBase64String(bytes));
            }
            else
            {
                var bytes = Convert.FromBase64String(input);
                Console.WriteLine(Json.Write(Xlm.Sidecar.Grpc.ProtoSchema.Decode(args[1], bytes, 0, bytes.Length)));
            }
            return 0;
#else
            Console.WriteLine("built without the gRPC transport (XLM_GRPC)");
            return 2;
#endif
        }
    }
}
