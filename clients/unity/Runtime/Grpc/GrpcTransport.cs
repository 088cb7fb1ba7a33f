using System;
using System.IO;
using System.Linq;
using System.Net;
using System.Net.Http;
using System.Net.Http.Headers;
using System.Reflection;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar.Grpc
{
    /// <summary>
    /// The daemon's gRPC service over an HttpClient that speaks HTTP/2: gRPC's framing and status
    /// trailers, protobuf through this package's own codec (ProtoSchema), no Grpc.Net.Client or
    /// Google.Protobuf needed. Unity's own HttpClient handler has no HTTP/2, so in Unity pass
    /// Cysharp's YetAnotherHttpHandler { Http2Only = true }; on .NET Core 3+ a SocketsHttpHandler
    /// works for http:// once h2c is switched on (EnableCleartextHttp2).
    /// </summary>
    public sealed class GrpcTransport : ISidecarTransport
    {
        readonly HttpClient http;
        readonly Uri baseUri;
        readonly string token;

        /// <param name="address">"http://127.0.0.1:50551" (the daemon's listening line names host:port).</param>
        /// <param name="handler">An HTTP/2 handler: YetAnotherHttpHandler in Unity, SocketsHttpHandler on .NET Core.</param>
        public GrpcTransport(string address, string token, HttpMessageHandler handler)
        {
            if (handler == null)
                throw new ArgumentNullException("handler", "gRPC needs an HTTP/2 handler (YetAnotherHttpHandler in Unity)");
            if (!address.Contains("://"))
                address = "http://" + address;
            if (!Uri.TryCreate(address, UriKind.Absolute, out baseUri))
                throw new ArgumentException("not a gRPC address (http://host:port): " + address, "address");
            this.token = token;
            http = new HttpClient(handler) { Timeout = System.Threading.Timeout.InfiniteTimeSpan };
        }

        /// <summary>.NET Core's SocketsHttpHandler refuses HTTP/2 without TLS unless this switch is on.</summary>
        public static void EnableCleartextHttp2()
        {
            AppContext.SetSwitch("System.Net.Http.SocketsHttpHandler.Http2UnencryptedSupport", true);
        }

        public string Address { get { return baseUri.ToString(); } }

        public async Task ConnectAsync(CancellationToken cancellationToken)
        {
            // gRPC has no session to open: a call proves the address, HTTP/2 and the token.
            await CallAsync("GetStatus", new JsonObject(), cancellationToken).ConfigureAwait(false);
        }

        public async Task<JsonObject> CallAsync(string method, JsonObject request, CancellationToken cancellationToken)
        {
            JsonObject response = null;
            await RunAsync(method, request, message => response = message, cancellationToken).ConfigureAwait(false);
            if (response == null)
                throw new SidecarException(SidecarStatusCode.Internal, method, "the daemon ended a unary call without a response");
            return response;
        }

        public Task StreamAsync(string method, JsonObject request, Action<JsonObject> onMessage, CancellationToken cancellationToken)
        {
            if (onMessage == null)
                throw new ArgumentNullException("onMessage");
            return RunAsync(method, request, onMessage, cancellationToken);
        }

        async Task RunAsync(string method, JsonObject request, Action<JsonObject> onMessage, CancellationToken ct)
        {
            ProtoMethod rpc;
            if (!ProtoSchema.Methods.TryGetValue(method, out rpc))
                throw new SidecarException(SidecarStatusCode.Unimplemented, method, "no such xlm.v1.Sidecar method");
            var body = ProtoSchema.Encode(rpc.Request, request);
            var frame = new byte[5 + body.Length];
            WriteLength(frame, body.Length);
            Buffer.BlockCopy(body, 0, frame, 5, body.Length);

            var message = new HttpRequestMessage(HttpMethod.Post, new Uri(baseUri, rpc.Path))
            {
                Version = new Version(2, 0),
                Content = new ByteArrayContent(frame),
            };
            message.Content.Headers.ContentType = new MediaTypeHeaderValue("application/grpc");
            message.Headers.TryAddWithoutValidation("te", "trailers");
            if (token != null)
                message.Headers.TryAddWithoutValidation("authorization", "Bearer " + token);

            HttpResponseMessage response;
            try
            {
                response = await http.SendAsync(message, HttpCompletionOption.ResponseHeadersRead, ct).ConfigureAwait(false);
            }
            catch (Exception e) when (!(e is OperationCanceledException && ct.IsCancellationRequested))
            {
                throw new SidecarUnavailableException(method, "cannot reach the daemon at " + baseUri + ": " + Innermost(e).Message, e);
            }
            using (response)
            {
                if (response.StatusCode != HttpStatusCode.OK)
                    throw new SidecarException(FromHttpStatus(response.StatusCode), method, "HTTP " + (int)response.StatusCode + " from " + baseUri);
                // A call that fails at once answers with the status in the headers (trailers-only).
                ThrowIfFailed(method, response.Headers);
                Exception handlerError = null;
                try
                {
                    using (var stream = await response.Content.ReadAsStreamAsync().ConfigureAwait(false))
                    using (ct.Register(() => response.Dispose())) // resets the HTTP/2 stream: the daemon cancels the call
                    {
                        while (true)
                        {
                            var next = await ReadMessageAsync(stream, ct).ConfigureAwait(false);
                            if (next == null)
                                break;
                            try
                            {
                                onMessage(ProtoSchema.Decode(rpc.Response, next, 0, next.Length));
                            }
                            catch (Exception e)
                            {
                                handlerError = e; // leaving resets the stream, which cancels the call
                                break;
                            }
                        }
                    }
                }
                catch (Exception e) when (!(e is SidecarException) && !(e is FormatException))
                {
                    ct.ThrowIfCancellationRequested();
                    throw new SidecarUnavailableException(method, "the connection to the daemon broke: " + Innermost(e).Message, e);
                }
                if (handlerError != null)
                    System.Runtime.ExceptionServices.ExceptionDispatchInfo.Capture(handlerError).Throw();
                ct.ThrowIfCancellationRequested();
                var trailers = Trailers(response);
                if (trailers == null || !trailers.Contains("grpc-status"))
                    throw new SidecarException(SidecarStatusCode.Internal, method, "the response ended without a gRPC status (no HTTP/2 trailers: is the handler HTTP/2?)");
                ThrowIfFailed(method, trailers);
            }
        }

        /// <summary>One length-prefixed message, or null at the end of the stream.</summary>
        static async Task<byte[]> ReadMessageAsync(Stream stream, CancellationToken ct)
        {
            var header = new byte[5];
            if (!await ReadExactlyAsync(stream, header, ct, true).ConfigureAwait(false))
                return null;
            if (header[0] != 0)
                throw new SidecarException(SidecarStatusCode.Internal, null, "the daemon sent a compressed message, which this client did not ask for");
            var length = (header[1] << 24) | (header[2] << 16) | (header[3] << 8) | header[4];
            if (length < 0 || length > 256 << 20)
                throw new SidecarException(SidecarStatusCode.ResourceExhausted, null, "a message from the daemon over 256 MiB");
            var body = new byte[length];
            await ReadExactlyAsync(stream, body, ct, false).ConfigureAwait(false);
            return body;
        }

        static async Task<bool> ReadExactlyAsync(Stream stream, byte[] buffer, CancellationToken ct, bool endAllowed)
        {
            var read = 0;
            while (read < buffer.Length)
            {
                var n = await stream.ReadAsync(buffer, read, buffer.Length - read, ct).ConfigureAwait(false);
                if (n == 0)
                {
                    if (read == 0 && endAllowed)
                        return false;
                    throw new IOException("the stream ended inside a gRPC message");
                }
                read += n;
            }
            return true;
        }

        static void ThrowIfFailed(string method, HttpHeaders headers)
        {
            var status = First(headers, "grpc-status");
            if (status == null || status == "0")
                return;
            int code;
            if (!int.TryParse(status, out code) || code < 0 || code > 16)
                code = (int)SidecarStatusCode.Unknown;
            var detail = First(headers, "grpc-message");
            throw SidecarException.For((SidecarStatusCode)code, method, detail == null ? "(no message)" : Uri.UnescapeDataString(detail));
        }

        static string First(HttpHeaders headers, string name)
        {
            System.Collections.Generic.IEnumerable<string> values;
            return headers.TryGetValues(name, out values) ? values.FirstOrDefault() : null;
        }

        // HttpResponseMessage.TrailingHeaders exists from .NET Core 3.0 and .NET Standard 2.1; older
        // profiles (Unity's ".NET Framework" level) get trailers from handlers under this property, the
        // convention YetAnotherHttpHandler and WinHttpHandler follow.
        static readonly PropertyInfo TrailingHeaders = typeof(HttpResponseMessage).GetProperty("TrailingHeaders");
        const string TrailersProperty = "__ResponseTrailers";

        static HttpHeaders Trailers(HttpResponseMessage response)
        {
            var trailers = TrailingHeaders != null ? (HttpHeaders)TrailingHeaders.GetValue(response) : null;
            if (trailers != null && trailers.Contains("grpc-status"))
                return trailers;
            object legacy;
            if (response.RequestMessage != null && response.RequestMessage.Properties.TryGetValue(TrailersProperty, out legacy))
                return legacy as HttpHeaders;
            return trailers;
        }

        static void WriteLength(byte[] frame, int length)
        {
            frame[0] = 0; // not compressed
            frame[1] = (byte)(length >> 24);
            frame[2] = (byte)(length >> 16);
            frame[3] = (byte)(length >> 8);
            frame[4] = (byte)length;
        }

        /// <summary>gRPC's mapping for HTTP errors that happen before gRPC answers.</summary>
        static SidecarStatusCode FromHttpStatus(HttpStatusCode status)
        {
            switch ((int)status)
            {
                case 400: return SidecarStatusCode.Internal;
                case 401: return SidecarStatusCode.Unauthenticated;
                case 403: return SidecarStatusCode.PermissionDenied;
                case 404: return SidecarStatusCode.Unimplemented;
                case 429:
                case 502:
                case 503:
                case 504: return SidecarStatusCode.Unavailable;
                default: return SidecarStatusCode.Unknown;
            }
        }

        static Exception Innermost(Exception e)
        {
            while (e.InnerException != null)
                e = e.InnerException;
            return e;
        }

        public void Dispose()
        {
            http.Dispose();
        }
    }
}
