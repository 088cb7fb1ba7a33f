using System;
using System.Collections.Generic;
using System.Runtime.ExceptionServices;
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

        /// <summary>`n` candidate replies (1 to 16) to one prompt, computed side by side from one prefill
        /// of it: lines for the player to choose from, or barks to pick among. One result per candidate,
        /// in order, each with its own Final; `onChunk` gets every candidate's chunks as they stream
        /// (GenerateChunk.Index says whose). Candidates are one-offs: the request may not have a
        /// SessionId (INVALID_ARGUMENT); send the chosen line in the session's next turn. With a fixed
        /// Seed, candidate i samples with Seed + i, so they differ.</summary>
        public Task<List<GenerationResult>> CandidatesAsync(GenerateRequest request, int n, Action<GenerateChunk> onChunk = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (request == null)
                throw new ArgumentNullException("request");
            if (n < 1)
                throw new ArgumentOutOfRangeException("n", n, "ask for at least one candidate");
            var json = request.ToJson();
            json["n"] = (uint)n;
            return StreamRepliesAsync("Generate", json, n, onChunk, cancellationToken);
        }

        /// <summary>Embeddings of short texts (1 to 256, each at most 512 tokens) from the served model,
        /// one per text in order: an NPC's memory, recalling what the player said by similarity. Unit
        /// vectors of one length, so Similarity (a dot product) is their cosine.</summary>
        public async Task<float[][]> EmbedAsync(IList<string> texts, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (texts == null)
                throw new ArgumentNullException("texts");
            var input = new List<object>();
            foreach (var text in texts)
            {
                if (text == null)
                    throw new ArgumentException("a text to embed is null", "texts");
                input.Add(text);
            }
            var json = await transport.CallAsync("Embed", new JsonObject { { "input", input } }, cancellationToken).ConfigureAwait(false);
            var embeddings = json.GetArray("embeddings");
            var vectors = new float[embeddings.Count][];
            for (var i = 0; i < embeddings.Count; i++)
            {
                var values = (embeddings[i] as JsonObject ?? new JsonObject()).GetArray("values");
                vectors[i] = new float[values.Count];
                for (var j = 0; j < values.Count; j++)
                    vectors[i][j] = values[j] is double ? (float)(double)values[j] : float.NaN;
            }
            return vectors;
        }

        /// <summary>The cosine similarity of two of EmbedAsync's vectors (their dot product): 1 for the
        /// same meaning, near 0 for unrelated texts.</summary>
        public static float Similarity(float[] a, float[] b)
        {
            if (a == null || b == null || a.Length != b.Length)
                throw new ArgumentException("compare two embeddings of one length");
            var dot = 0.0;
            for (var i = 0; i < a.Length; i++)
                dot += (double)a[i] * b[i];
            return (float)dot;
        }

        /// <summary>The served model's tokens for `text`: count them before sending, or find the ids a
        /// SamplingParams.LogitBias needs. `addSpecial` adds the model's beginning-of-text token where it
        /// wants one; `parseSpecial` reads control-token text (&lt;|im_end|&gt;) as those tokens.</summary>
        public async Task<int[]> TokenizeAsync(string text, bool addSpecial = false, bool parseSpecial = false,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (text == null)
                throw new ArgumentNullException("text");
            var request = new JsonObject { { "text", text } };
            if (addSpecial) request["addSpecial"] = true;
            if (parseSpecial) request["parseSpecial"] = true;
            var json = await transport.CallAsync("Tokenize", request, cancellationToken).ConfigureAwait(false);
            var tokens = json.GetArray("tokens");
            var ids = new int[tokens.Count];
            for (var i = 0; i < tokens.Count; i++)
                ids[i] = tokens[i] is double ? (int)(double)tokens[i] : 0;
            return ids;
        }

        /// <summary>The text of the served model's tokens. INVALID_ARGUMENT for an id outside its vocabulary.</summary>
        public async Task<string> DetokenizeAsync(IList<int> tokens, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (tokens == null)
                throw new ArgumentNullException("tokens");
            var ids = new List<object>();
            foreach (var token in tokens)
                ids.Add(token);
            var json = await transport.CallAsync("Detokenize", new JsonObject { { "tokens", ids } }, cancellationToken).ConfigureAwait(false);
            return json.GetString("text");
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

        /// <summary>How the game's frames went over a window (FrameStats.TakeReport); answers what the
        /// daemon's frame-time guard does now. FrameReporter sends one a second by itself (the
        /// SidecarLauncher's Report Frames). Only the game's reports count: PERMISSION_DENIED from a
        /// process other than the one the daemon watches (the game that launched it, --parent-pid),
        /// unless the client carries the game token (XLM_SIDECAR_GAME_TOKEN). INVALID_ARGUMENT for
        /// impossible figures, RESOURCE_EXHAUSTED past 20 reports a second.</summary>
        public async Task<FrameGuardState> ReportFramesAsync(FrameReport report, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (report == null)
                throw new ArgumentNullException("report");
            var json = await transport.CallAsync("ReportFrames", report.ToJson(), cancellationToken).ConfigureAwait(false);
            return FrameGuardState.FromJson(json);
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
            var replies = await StreamRepliesAsync(method, request, 1, onChunk, ct).ConfigureAwait(false);
            return replies[0];
        }

        /// <summary>A stream of `count` replies, each chunk routed by its index.</summary>
        async Task<List<GenerationResult>> StreamRepliesAsync(string method, JsonObject request, int count, Action<GenerateChunk> onChunk,
            CancellationToken ct)
        {
            var replies = new ReplyBuilder[count];
            for (var i = 0; i < count; i++)
                replies[i] = new ReplyBuilder();
            var failure = new CallbackFailure();
            using (var call = CancellationTokenSource.CreateLinkedTokenSource(ct))
            {
                // Runs on the transport's thread, one message at a time, so the totals need no lock.
                Action<JsonObject> onMessage = json =>
                {
                    var chunk = GenerateChunk.FromJson(json);
                    if (chunk.Index < 0 || chunk.Index >= count)
                    {
                        failure.Run(() =>
                        {
                            throw new SidecarException(SidecarStatusCode.Internal, method,
                                "the daemon sent a chunk of candidate " + chunk.Index + " of " + count);
                        }, call);
                        return;
                    }
                    replies[chunk.Index].Add(chunk);
                    if (onChunk != null)
                        dispatcher.Post(() => failure.Run(() => onChunk(chunk), call));
                };
                await RunStreamAsync(method, request, onMessage, call.Token, ct, failure).ConfigureAwait(false);
            }
            var results = new List<GenerationResult>(count);
            foreach (var reply in replies)
                results.Add(reply.Finish());
            return results;
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
