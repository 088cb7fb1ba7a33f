using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.IO;
using System.Net.WebSockets;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar
{
    /// <summary>
    /// The daemon's WebSocket bridge (ws://127.0.0.1:port+1): JSON text frames, several calls on one
    /// socket told apart by id, cancel frames, errors as gRPC status names. System.Net.WebSockets is in
    /// every Unity player that has sockets, so this needs no native plugin (not WebGL: browsers have
    /// no ClientWebSocket).
    ///
    /// The socket opens on the first call (or ConnectAsync), authenticates with a first
    /// {"auth": token} frame, and reopens on the next call after it drops; calls in flight when it
    /// drops fail with SidecarUnavailableException.
    /// </summary>
    public sealed class WebSocketTransport : ISidecarTransport
    {
        readonly Uri uri;
        readonly string token;
        readonly TimeSpan connectTimeout;
        readonly SemaphoreSlim connectLock = new SemaphoreSlim(1, 1);
        Connection current;
        int nextId;
        volatile bool disposed;

        /// <param name="address">The bridge's address, "ws://127.0.0.1:50552" (the daemon's listening line names it).</param>
        /// <param name="token">The launch's token (XLM_SIDECAR_TOKEN); null for a daemon started with --no-auth.</param>
        public WebSocketTransport(string address, string token, TimeSpan? connectTimeout = null)
        {
            if (string.IsNullOrEmpty(address))
                throw new ArgumentException("the daemon's WebSocket address is needed, e.g. ws://127.0.0.1:50552", "address");
            Uri parsed;
            if (!Uri.TryCreate(address, UriKind.Absolute, out parsed) || parsed.Scheme != "ws" && parsed.Scheme != "wss")
                throw new ArgumentException("not a WebSocket address (ws://host:port): " + address, "address");
            uri = parsed;
            this.token = token;
            this.connectTimeout = connectTimeout ?? TimeSpan.FromSeconds(10);
        }

        public string Address { get { return uri.ToString(); } }

        public async Task ConnectAsync(CancellationToken cancellationToken)
        {
            await GetConnectionAsync(cancellationToken).ConfigureAwait(false);
        }

        public async Task<JsonObject> CallAsync(string method, JsonObject request, CancellationToken cancellationToken)
        {
            return await RunAsync(method, request, null, cancellationToken).ConfigureAwait(false);
        }

        public Task StreamAsync(string method, JsonObject request, Action<JsonObject> onMessage, CancellationToken cancellationToken)
        {
            if (onMessage == null)
                throw new ArgumentNullException("onMessage");
            return RunAsync(method, request, onMessage, cancellationToken);
        }

        async Task<JsonObject> RunAsync(string method, JsonObject request, Action<JsonObject> onMessage, CancellationToken ct)
        {
            ct.ThrowIfCancellationRequested();
            var connection = await GetConnectionAsync(ct).ConfigureAwait(false);
            var call = new PendingCall("c" + Interlocked.Increment(ref nextId), method, onMessage, ct);
            connection.Add(call);
            try
            {
                var frame = new JsonObject { { "id", call.Id }, { "method", method }, { "request", request ?? new JsonObject() } };
                await connection.SendAsync(frame, CancellationToken.None).ConfigureAwait(false);
                using (ct.Register(() => connection.Cancel(call)))
                    return await call.Done.Task.ConfigureAwait(false);
            }
            finally
            {
                connection.Remove(call);
            }
        }

        async Task<Connection> GetConnectionAsync(CancellationToken ct)
        {
            if (disposed)
                throw new ObjectDisposedException("WebSocketTransport");
            var c = current;
            if (c != null && c.IsOpen)
                return c;
            await connectLock.WaitAsync(ct).ConfigureAwait(false);
            try
            {
                if (disposed)
                    throw new ObjectDisposedException("WebSocketTransport");
                c = current;
                if (c != null && c.IsOpen)
                    return c;
                current = await Connection.OpenAsync(uri, token, connectTimeout, ct).ConfigureAwait(false);
                return current;
            }
            finally
            {
                connectLock.Release();
            }
        }

        public void Dispose()
        {
            disposed = true;
            var c = current;
            current = null;
            if (c != null)
                c.Abort("the client was disposed");
        }

        sealed class PendingCall
        {
            public readonly string Id;
            public readonly string Method;
            public readonly Action<JsonObject> OnMessage;
            public readonly CancellationToken Token;
            // Continuations run off the receive loop, so a slow awaiter cannot stall other calls.
            public readonly TaskCompletionSource<JsonObject> Done =
                new TaskCompletionSource<JsonObject>(TaskCreationOptions.RunContinuationsAsynchronously);
            public int CancelSent;

            public PendingCall(string id, string method, Action<JsonObject> onMessage, CancellationToken token)
            {
                Id = id;
                Method = method;
                OnMessage = onMessage;
                Token = token;
            }
        }

        /// <summary>One open socket: its receive loop, its calls, one sender at a time.</summary>
        sealed class Connection
        {
            // Frames from the daemon are bounded by its --max-message-bytes; this only stops a broken
            // peer from growing the game's memory without end.
            const int MaxFrameBytes = 256 << 20;
            // CloseStatus 1008 (policy violation) is how the bridge refuses a token.
            const WebSocketCloseStatus Unauthenticated = WebSocketCloseStatus.PolicyViolation;

            readonly ClientWebSocket socket;
            readonly SemaphoreSlim sendLock = new SemaphoreSlim(1, 1);
            readonly ConcurrentDictionary<string, PendingCall> calls = new ConcurrentDictionary<string, PendingCall>();
            readonly MemoryStream message = new MemoryStream();
            readonly byte[] buffer = new byte[16 << 10];
            volatile string closedBecause;

            Connection(ClientWebSocket socket)
            {
                this.socket = socket;
            }

            public bool IsOpen { get { return closedBecause == null && socket.State == WebSocketState.Open; } }

            public static async Task<Connection> OpenAsync(Uri uri, string token, TimeSpan timeout, CancellationToken ct)
            {
                var socket = new ClientWebSocket();
                var connection = new Connection(socket);
                using (var deadline = CancellationTokenSource.CreateLinkedTokenSource(ct))
                {
                    deadline.CancelAfter(timeout);
                    try
                    {
                        await socket.ConnectAsync(uri, deadline.Token).ConfigureAwait(false);
                        if (token != null)
                            await connection.AuthenticateAsync(token, deadline.Token).ConfigureAwait(false);
                    }
                    catch (Exception e)
                    {
                        socket.Abort();
                        socket.Dispose();
                        if (e is SidecarException)
                            throw;
                        ct.ThrowIfCancellationRequested();
                        if (e is OperationCanceledException)
                            throw new SidecarUnavailableException(null, "no answer from " + uri + " within " + timeout.TotalSeconds + " s", e);
                        throw new SidecarUnavailableException(null, "cannot connect to " + uri + ": " + Innermost(e).Message + " (is the daemon running, and is this its ws_address?)", e);
                    }
                }
                // The loop ends by itself when the socket closes; Abort is how it reports that.
                _ = Task.Run(() => connection.ReceiveLoopAsync());
                return connection;
            }

            async Task AuthenticateAsync(string token, CancellationToken ct)
            {
                await SendAsync(new JsonObject { { "auth", token } }, ct).ConfigureAwait(false);
                var reply = await ReceiveFrameAsync(ct).ConfigureAwait(false);
                if (reply == null)
                {
                    var refused = socket.CloseStatus == Unauthenticated;
                    var why = socket.CloseStatusDescription ?? "closed";
                    if (refused)
                        throw new SidecarAuthenticationException(null, "the daemon refused the token (" + why + ")");
                    throw new SidecarUnavailableException(null, "the daemon closed the connection while authenticating (" + why + ")");
                }
                if (reply.GetString("auth") == "ok")
                    return;
                var error = reply.GetObject("error");
                if (error != null)
                    throw SidecarException.For(SidecarException.ParseCode(error.GetString("code")), null, error.GetString("message"));
                throw new SidecarException(SidecarStatusCode.Internal, null, "unexpected first frame from the daemon: " + reply);
            }

            /// <summary>The next whole frame as JSON, or null when the daemon closed the socket.</summary>
            async Task<JsonObject> ReceiveFrameAsync(CancellationToken ct)
            {
                message.SetLength(0);
                while (true)
                {
                    var result = await socket.ReceiveAsync(new ArraySegment<byte>(buffer), ct).ConfigureAwait(false);
                    if (result.MessageType == WebSocketMessageType.Close)
                        return null;
                    if (message.Length + result.Count > MaxFrameBytes)
                        throw new SidecarException(SidecarStatusCode.ResourceExhausted, null, "a frame from the daemon exceeded " + (MaxFrameBytes >> 20) + " MiB");
                    message.Write(buffer, 0, result.Count);
                    if (result.EndOfMessage)
                        break;
                }
                var text = Encoding.UTF8.GetString(message.GetBuffer(), 0, (int)message.Length);
                try
                {
                    return Json.ParseObject(text);
                }
                catch (FormatException e)
                {
                    throw new SidecarException(SidecarStatusCode.Internal, null, "the daemon sent a frame that is not a JSON object: " + e.Message, e);
                }
            }

            async Task ReceiveLoopAsync()
            {
                string reason;
                try
                {
                    while (true)
                    {
                        var frame = await ReceiveFrameAsync(CancellationToken.None).ConfigureAwait(false);
                        if (frame == null)
                        {
                            var status = socket.CloseStatus;
                            reason = "the daemon closed the connection" +
                                (status.HasValue ? " (" + (int)status.Value + " " + socket.CloseStatusDescription + ")" : "");
                            break;
                        }
                        Dispatch(frame);
                    }
                }
                catch (Exception e)
                {
                    reason = closedBecause ?? "the connection to the daemon was lost: " + Innermost(e).Message;
                }
                Abort(reason);
            }

            void Dispatch(JsonObject frame)
            {
                var id = frame.GetString("id", null);
                var error = frame.GetObject("error");
                if (id == null)
                {
                    // An error not tied to a call means one of our frames could not be read; which
                    // call it was is unknown, so fail them all rather than leave one waiting forever.
                    if (error != null)
                        foreach (var c in calls.Values)
                            c.Done.TrySetException(SidecarException.For(SidecarException.ParseCode(error.GetString("code")), c.Method, error.GetString("message")));
                    return;
                }
                PendingCall call;
                if (!calls.TryGetValue(id, out call))
                    return; // a call that already ended (its cancel crossed the last frame)
                if (frame.ContainsKey("chunk"))
                {
                    var chunk = frame.GetObject("chunk") ?? new JsonObject();
                    try
                    {
                        if (call.OnMessage != null)
                            call.OnMessage(chunk);
                    }
                    catch (Exception e)
                    {
                        // The caller's handler failed: end the call with its exception, and stop the daemon's work.
                        call.Done.TrySetException(e);
                        Cancel(call);
                    }
                }
                else if (frame.ContainsKey("result"))
                {
                    call.Done.TrySetResult(frame.GetObject("result") ?? new JsonObject());
                }
                else if (frame.ContainsKey("end"))
                {
                    call.Done.TrySetResult(null);
                }
                else if (error != null)
                {
                    var code = SidecarException.ParseCode(error.GetString("code"));
                    if (code == SidecarStatusCode.Cancelled && call.Token.IsCancellationRequested)
                        call.Done.TrySetCanceled(call.Token);
                    else
                        call.Done.TrySetException(SidecarException.For(code, call.Method, error.GetString("message")));
                }
            }

            public void Add(PendingCall call)
            {
                if (!IsOpen)
                    throw new SidecarUnavailableException(call.Method, closedBecause ?? "the connection to the daemon is closed");
                calls[call.Id] = call;
                // Abort may have swept the calls between the check and the insert.
                if (closedBecause != null)
                    call.Done.TrySetException(new SidecarUnavailableException(call.Method, closedBecause));
            }

            public void Remove(PendingCall call)
            {
                PendingCall ignored;
                calls.TryRemove(call.Id, out ignored);
            }

            /// <summary>Ask the daemon to cancel a call; its error frame (CANCELLED) ends it.</summary>
            public void Cancel(PendingCall call)
            {
                if (Interlocked.Exchange(ref call.CancelSent, 1) != 0 || call.Done.Task.IsCompleted)
                    return;
                SendAsync(new JsonObject { { "id", call.Id }, { "cancel", true } }, CancellationToken.None).ContinueWith(t =>
                {
                    // Without the cancel frame the daemon would never answer: end the call here.
                    if (t.IsFaulted || t.IsCanceled)
                        call.Done.TrySetCanceled(call.Token);
                }, TaskScheduler.Default);
            }

            public async Task SendAsync(JsonObject frame, CancellationToken ct)
            {
                var bytes = Encoding.UTF8.GetBytes(Json.Write(frame));
                // ClientWebSocket allows one send at a time.
                await sendLock.WaitAsync(ct).ConfigureAwait(false);
                try
                {
                    await socket.SendAsync(new ArraySegment<byte>(bytes), WebSocketMessageType.Text, true, ct).ConfigureAwait(false);
                }
                catch (Exception e)
                {
                    if (e is OperationCanceledException && ct.IsCancellationRequested)
                        throw;
                    var reason = "sending to the daemon failed: " + Innermost(e).Message;
                    Abort(reason);
                    throw new SidecarUnavailableException(null, reason, e);
                }
                finally
                {
                    sendLock.Release();
                }
            }

            /// <summary>Close for good and fail every call still waiting.</summary>
            public void Abort(string reason)
            {
                if (closedBecause == null)
                    closedBecause = reason;
                try
                {
                    socket.Abort();
                }
                catch (Exception)
                {
                    // Already closed: nothing left to release.
                }
                foreach (var call in calls.Values)
                {
                    if (call.Token.IsCancellationRequested)
                        call.Done.TrySetCanceled(call.Token);
                    else
                        call.Done.TrySetException(new SidecarUnavailableException(call.Method, closedBecause));
                }
            }

            static Exception Innermost(Exception e)
            {
                while (e.InnerException != null)
                    e = e.InnerException;
                return e;
            }
        }
    }
}
