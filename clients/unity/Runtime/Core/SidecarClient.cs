using System;
using System.Runtime.ExceptionServices;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar
{
    /// <summary>
    /// The xlm.v1.Sidecar API as Tasks. Make it on the main thread: streaming callbacks (onChunk,
    /// onEvent) are posted to the SynchronizationContext current then, so in Unity they run on the
    /// main thread in order, and a streaming call's Task completes only after all its callbacks ran.
    /// Never block on these Tasks (.Result, .Wait()) on the main thread: the callbacks need it.
    ///
    /// Errors: SidecarException with the daemon's status code (SidecarAuthenticationException for a
    /// wrong token, SidecarUnavailableException when no daemon answers); a cancelled token gives
    /// OperationCanceledException, and cancels the work on the daemon as well.
    /// </summary>
    public sealed class SidecarClient : IDisposable
    {
        readonly ISidecarTransport transport;
        readonly EventDispatcher dispatcher;

        /// <summary>A client of the WebSocket bridge, e.g. new SidecarClient("ws://127.0.0.1:50552", token).</summary>
        public SidecarClient(string webSocketAddress, string token)
            : this(new WebSocketTransport(webSocketAddress, token), SynchronizationContext.Current) { }

        /// <param name="eventContext">Where callbacks run; null runs them on the transport's thread.</param>
        public SidecarClient(ISidecarTransport transport, SynchronizationContext eventContext)
        {
            if (transport == null)
                throw new ArgumentNullException("transport");
            this.transport = transport;
            dispatcher = new EventDispatcher(eventContext);
        }

        public ISidecarTransport Transport { get { return transport; } }
        public EventDispatcher Dispatcher { get { return dispatcher; } }

        /// <summary>Connect and authenticate now (otherwise the first call does).</summary>
        public Task ConnectAsync(CancellationToken cancellationToken = default(CancellationToken))
        {
            return transport.ConnectAsync(cancellationToken);
        }

        /// <summary>Generate a reply; `onChunk` gets each piece as it streams.</summary>
        public Task<GenerationResult> GenerateAsync(GenerateRequest request, Action<GenerateChunk> onChunk = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (request == null)
                throw new ArgumentNullException("request");
            return StreamReplyAsync("Generate", request.ToJson(), onChunk, cancellationToken);
        }

        /// <summary>Ask about an image (a screenshot); streams like GenerateAsync. FAILED_PRECONDITION
        /// when the daemon has no vision projector (--mmproj).</summary>
        public Task<GenerationResult> AskImageAsync(AskImageRequest request, Action<GenerateChunk> onChunk = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (request == null)
                throw new ArgumentNullException("request");
            return StreamReplyAsync("AskImage", request.ToJson(), onChunk, cancellationToken);
        }

        /// <summary>Tell the daemon what VRAM and CPU threads the game can spare; returns once in force.</summary>
        public async Task<SetBudgetResponse> SetBudgetAsync(SetBudgetRequest request,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (request == null)
                throw new ArgumentNullException("request");
            var json = await transport.CallAsync("SetBudget", request.ToJson(), cancellationToken).ConfigureAwait(false);
            return SetBudgetResponse.FromJson(json);
        }

        public async Task<Status> GetStatusAsync(CancellationToken cancellationToken = default(CancellationToken))
        {
            var json = await transport.CallAsync("GetStatus", new JsonObject(), cancellationToken).ConfigureAwait(false);
            return Status.FromJson(json);
        }

        /// <summary>Forget an NPC's conversation; returns the tokens freed. NOT_FOUND for an unknown session.</summary>
        public async Task<uint> EndSessionAsync(string sessionId, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (string.IsNullOrEmpty(sessionId))
                throw new ArgumentException("a session id is needed", "sessionId");
            var json = await transport.CallAsync("EndSession", new JsonObject { { "sessionId", sessionId } }, cancellationToken).ConfigureAwait(false);
            return json.GetUInt32("tokensFreed");
        }

        /// <summary>Follow the daemon's state: `onEvent` gets the current state, then each change, until
        /// the token is cancelled (OperationCanceledException) or the daemon drains (completes).</summary>
        public async Task WatchStateAsync(Action<StateEvent> onEvent, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (onEvent == null)
                throw new ArgumentNullException("onEvent");
            var failure = new CallbackFailure();
            using (var call = CancellationTokenSource.CreateLinkedTokenSource(cancellationToken))
            {
                Action<JsonObject> onMessage = json =>
                {
                    var e = StateEvent.FromJson(json);
                    dispatcher.Post(() => failure.Run(() => onEvent(e), call));
                };
                await RunStreamAsync("WatchState", new JsonObject(), onMessage, call.Token, cancellationToken, failure).ConfigureAwait(false);
            }
        }

        async Task<GenerationResult> StreamReplyAsync(string method, JsonObject request, Action<GenerateChunk> onChunk, CancellationToken ct)
        {
            var result = new GenerationResult();
            var text = new StringBuilder();
            var failure = new CallbackFailure();
            using (var call = CancellationTokenSource.CreateLinkedTokenSource(ct))
            {
                // Runs on the transport's thread, one message at a time, so the totals need no lock.
                Action<JsonObject> onMessage = json =>
                {
                    var chunk = GenerateChunk.FromJson(json);
                    text.Append(chunk.Text);
                    result.Chunks++;
                    result.Tokens += chunk.TokenIds.Length;
                    if (chunk.Final != null)
                        result.Final = chunk.Final;
                    if (onChunk != null)
                        dispatcher.Post(() => failure.Run(() => onChunk(chunk), call));
                };
                await RunStreamAsync(method, request, onMessage, call.Token, ct, failure).ConfigureAwait(false);
            }
            result.Text = text.ToString();
            return result;
        }

        async Task RunStreamAsync(string method, JsonObject request, Action<JsonObject> onMessage, CancellationToken token,
            CancellationToken callerToken, CallbackFailure failure)
        {
            Exception ended = null;
            try
            {
                await transport.StreamAsync(method, request, onMessage, token).ConfigureAwait(false);
            }
            catch (Exception e)
            {
                ended = e;
            }
            // Let every posted callback run first: the caller sees the whole reply before the Task ends.
            await dispatcher.FlushAsync().ConfigureAwait(false);
            // A handler that threw cancelled the call; its exception says more than the cancellation.
            if (failure.Error != null)
                ExceptionDispatchInfo.Capture(failure.Error).Throw();
            // Report the caller's own token, not the linked one the call ran under.
            if (ended is OperationCanceledException && callerToken.IsCancellationRequested)
                throw new OperationCanceledException(method + " was cancelled", ended, callerToken);
            if (ended != null)
                ExceptionDispatchInfo.Capture(ended).Throw();
        }

        public void Dispose()
        {
            transport.Dispose();
        }

        /// <summary>The first exception a caller's handler threw; it cancels the call.</summary>
        sealed class CallbackFailure
        {
            public volatile Exception Error;

            public void Run(Action handler, CancellationTokenSource call)
            {
                if (Error != null)
                    return; // the call is being cancelled: later chunks are not delivered
                try
                {
                    handler();
                }
                catch (Exception e)
                {
                    Error = e;
                    try
                    {
                        call.Cancel();
                    }
                    catch (ObjectDisposedException)
                    {
                        // The call already ended.
                    }
                }
            }
        }
    }
}
