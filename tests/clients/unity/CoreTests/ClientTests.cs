using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar.Tests
{
    /// <summary>
    /// The client against a live daemon (pytest starts it on the tiny random llama, so text is byte
    /// garbage: these check structure, counts and behaviour, never words).
    /// </summary>
    public static class ClientTests
    {
        // With its end-of-generation tokens banned (NoEarlyEnd) a reply runs to MaxTokens, so a long
        // request is surely still running when a test cancels it; pytest's daemon allows this many
        // tokens (--max-tokens-per-request), which take seconds at that depth of context.
        const string Endless = "count";
        const uint Long = 8000;

        public static void Register()
        {
            TestRunner.Add("streaming_arrives_in_chunks_on_the_main_thread", Streaming);
            TestRunner.Add("cancel_ends_the_call_and_frees_the_request", Cancel);
            TestRunner.Add("status_says_where_a_streaming_request_is", StatusListsARequest);
            TestRunner.Add("session_reuse_hits_the_kv_cache", SessionReuse);
            TestRunner.Add("npcs_reply_at_once_one_turn_each", ManyNpcs);
            TestRunner.Add("json_schema_mode_returns_a_structured_action", StructuredAction);
            TestRunner.Add("budget_update_applies_and_is_watched", BudgetUpdate);
            TestRunner.Add("budget_updates_coalesce_to_the_newest", BudgetCoalescing);
            TestRunner.Add("screenshot_question_about_raw_pixels", ScreenshotQuestion);
            TestRunner.Add("wrong_token_is_refused", WrongToken);
            TestRunner.Add("errors_carry_status_codes", Errors);
            TestRunner.Add("a_handler_that_throws_ends_the_call_with_its_exception", HandlerThrows);
            TestRunner.Add("no_daemon_is_unavailable", NoDaemon);
        }

        static SidecarClient NewClient()
        {
            return Env.Client(Env.Token);
        }

        static GenerateRequest Greedy(string prompt, uint maxTokens)
        {
            return new GenerateRequest { Prompt = prompt, MaxTokens = maxTokens, Sampling = new SamplingParams { Temperature = 0 } };
        }

        /// <summary>Greedy, and run to maxTokens whatever the machine (NoEarlyEnd).</summary>
        static async Task<GenerateRequest> Whole(SidecarClient client, string prompt, uint maxTokens)
        {
            return new GenerateRequest { Prompt = prompt, MaxTokens = maxTokens, Sampling = await NoEarlyEnd.Ban(client) };
        }

        static async Task<Status> WaitUntilIdle(SidecarClient client)
        {
            var clock = Stopwatch.StartNew();
            while (true)
            {
                var status = await client.GetStatusAsync();
                if (status.RequestsActive == 0 && status.RequestsQueued == 0 && status.Requests.Count == 0)
                    return status;
                if (clock.Elapsed > TimeSpan.FromSeconds(15))
                    throw new AssertionFailed("the daemon still has " + status.RequestsActive + " active requests");
                await Task.Delay(50);
            }
        }

        static async Task Streaming()
        {
            using (var client = NewClient())
            {
                var chunks = 0;
                var tokens = 0;
                var offMainThread = 0;
                GenerationFinal final = null;
                var result = await client.GenerateAsync(await Whole(client, Endless, 24), chunk =>
                {
                    chunks++;
                    tokens += chunk.TokenIds.Length;
                    if (!MainThread.IsCurrent) offMainThread++;
                    if (chunk.Final != null) final = chunk.Final;
                });
                Check.Equal(Env.Grpc ? "GrpcTransport" : "WebSocketTransport", client.Transport.GetType().Name, "the transport under test");
                Check.True(MainThread.IsCurrent, "the await resumes on the main thread");
                Check.Equal(0, offMainThread, "chunks delivered off the main thread");
                Check.Equal(result.Chunks, chunks, "every chunk was delivered before the Task completed");
                Check.True(chunks >= 2, "the reply streamed in several chunks, got " + chunks);
                Check.True(final != null && ReferenceEquals(final, result.Final), "the last chunk carries the final summary");
                Check.Equal(FinishReason.Length, result.FinishReason, "finish reason");
                Check.Equal(24u, result.Usage.CompletionTokens, "completion tokens");
                Check.Equal(24, tokens, "token ids across chunks");
                Check.Equal(24, result.Tokens, "token ids counted by the client");
                Check.True(result.Usage.PromptTokens > 0, "prompt tokens counted");
                Check.True(result.Final.Timings.TotalMs > 0, "timings reported");
            }
        }

        static async Task Cancel()
        {
            using (var client = NewClient())
            using (var cancel = new CancellationTokenSource())
            {
                var tokens = 0;
                var call = client.GenerateAsync(await Whole(client, Endless, Long), chunk =>
                {
                    tokens += chunk.TokenIds.Length;
                    cancel.Cancel(); // from a handler on the main thread, as a game's "skip" button would
                }, cancel.Token);
                var e = await Check.Throws<OperationCanceledException>(() => call, "a cancelled reply");
                Check.Equal(cancel.Token, e.CancellationToken, "the caller's token is the one reported");
                Check.True(tokens > 0 && tokens < Long, "it stopped early, after " + tokens + " tokens");
                await WaitUntilIdle(client);
                // The socket is still good for the next call.
                var next = await client.GenerateAsync(await Whole(client, "again", 4));
                Check.Equal(4u, next.Usage.CompletionTokens, "a call after the cancel");
            }
        }

        static async Task StatusListsARequest()
        {
            using (var client = NewClient())
            using (var cancel = new CancellationTokenSource())
            {
                var request = await Whole(client, Endless, Long);
                request.RequestId = "status-" + Guid.NewGuid().ToString("N");
                var streaming = new TaskCompletionSource<bool>();
                var call = client.GenerateAsync(request, chunk => streaming.TrySetResult(true), cancel.Token);
                await streaming.Task;
                var status = await client.GetStatusAsync();
                var listed = status.Requests.Find(r => r.RequestId == request.RequestId);
                Check.True(listed != null, "GetStatus lists the streaming request among " + status.Requests.Count);
                Check.Equal("DECODING", listed.State, "its state");
                Check.True(listed.PromptTokens > 0 && listed.PromptTokensDone == listed.PromptTokens, "its prompt is all in the cache");
                Check.True(listed.TokensGenerated > 0 && listed.AgeMs > 0, "its tokens and age");
                cancel.Cancel();
                await Check.Throws<OperationCanceledException>(() => call, "the cancelled reply");
                await WaitUntilIdle(client);  // which lists no request
            }
        }

        static async Task SessionReuse()
        {
            using (var client = NewClient())
            {
                var npc = new NpcConversation(client, "brom-" + Guid.NewGuid().ToString("N"), "You are Brom, a gruff dwarven blacksmith.")
                {
                    MaxTokens = 6,
                    Sampling = await NoEarlyEnd.Ban(client),
                };
                var pieces = new List<string>();
                var first = await npc.SayAsync("Greetings, smith.", piece => pieces.Add(piece));
                Check.Equal(FinishReason.Length, first.FinishReason, "turn 1 finish reason");
                Check.Equal(string.Join("", pieces), first.Text, "onText pieces add up to the reply");
                var second = await npc.SayAsync("Can you mend my sword?");
                Check.True(second.Usage.PromptTokens > first.Usage.PromptTokens + first.Usage.CompletionTokens,
                    "turn 2's prompt holds turn 1 (" + second.Usage.PromptTokens + " tokens)");
                Check.True(second.Usage.CachedPromptTokens >= first.Usage.PromptTokens,
                    "turn 2 reused turn 1 from the KV cache: " + second.Usage.CachedPromptTokens + " cached of " + second.Usage.PromptTokens);
                Check.Equal(npc.NpcId, second.Final.SessionId, "the session is echoed");
                var status = await client.GetStatusAsync();
                Check.True(status.Sessions.Exists(s => s.SessionId == npc.NpcId), "the daemon lists the NPC's session");

                npc.Reset();
                var fresh = await npc.SayAsync("Who are you?");
                Check.True(fresh.Usage.PromptTokens < second.Usage.PromptTokens, "after Reset the history is gone");

                await npc.EndAsync();
                status = await client.GetStatusAsync();
                Check.True(!status.Sessions.Exists(s => s.SessionId == npc.NpcId), "EndAsync freed the session");
                var e = await Check.Throws<SidecarException>(() => client.EndSessionAsync(npc.NpcId), "ending it twice");
                Check.Equal(SidecarStatusCode.NotFound, e.Code, "an unknown session");
            }
        }

        static async Task ManyNpcs()
        {
            using (var client = NewClient())
            {
                // Both replies run to their length (NoEarlyEnd), so both are surely in flight together;
                // their text is not compared: llama.cpp promises no identical tokens across batch shapes.
                var a = new NpcConversation(client, "guard-" + Guid.NewGuid().ToString("N")) { MaxTokens = 40, Sampling = await NoEarlyEnd.Ban(client) };
                var b = new NpcConversation(client, "merchant-" + Guid.NewGuid().ToString("N")) { MaxTokens = 40, Sampling = await NoEarlyEnd.Ban(client) };
                var ta = a.SayAsync(Endless);
                var tb = b.SayAsync(Endless);
                Check.True(a.IsReplying, "the guard is replying");
                await Check.Throws<InvalidOperationException>(() => a.SayAsync("hello?"), "a second line while the NPC answers");
                var both = await Task.WhenAll(ta, tb);
                Check.Equal(40u, both[0].Usage.CompletionTokens, "the guard's whole reply");
                Check.Equal(40u, both[1].Usage.CompletionTokens, "the merchant's whole reply");
                Check.True(both[0].Final.SessionId != both[1].Final.SessionId, "each in its own session");
                Check.True(!a.IsReplying, "the guard is done");
                await a.EndAsync();
                await b.EndAsync();
            }
        }

        static async Task StructuredAction()
        {
            using (var client = NewClient())
            {
                var npc = new NpcConversation(client, "goblin-" + Guid.NewGuid().ToString("N")) { MaxTokens = 60 };
                const string schema = "{\"type\":\"object\",\"properties\":{\"action\":{\"enum\":[\"wave\",\"attack\",\"flee\"]}},\"required\":[\"action\"]}";
                var action = await npc.ActAsync("A knight approaches. What do you do?", schema);
                Check.True(action.Object != null, "the reply is a JSON object: " + action.Json);
                var chosen = action.Object.GetString("action");
                Check.True(chosen == "wave" || chosen == "attack" || chosen == "flee", "the action is one the schema allows: " + action.Json);
                await npc.EndAsync();
            }
        }

        static async Task BudgetUpdate()
        {
            using (var client = NewClient())
            using (var stop = new CancellationTokenSource())
            {
                var events = new List<StateEvent>();
                var offMainThread = 0;
                var watching = client.WatchStateAsync(e =>
                {
                    if (!MainThread.IsCurrent) offMainThread++;
                    events.Add(e);
                }, stop.Token);
                // The watch sees changes from its first event on; a change before it would only show in that event.
                var clock = Stopwatch.StartNew();
                while (events.Count == 0 && clock.Elapsed < TimeSpan.FromSeconds(10))
                    await Task.Delay(10);
                Check.True(events.Count > 0 && events[0].Reason == "initial" && events[0].Phase == EnginePhase.Ready, "WatchState starts with the state as it is");

                var applied = await client.SetBudgetAsync(SetBudgetRequest.Vram("0", 1));
                Check.Equal(0UL, applied.Budget.VramBytes, "VRAM budget in force");
                Check.Equal(1u, applied.Budget.MaxCpuThreads, "thread cap in force");
                Check.True(applied.Schedule.Tiers.Count > 0, "the schedule comes back");
                var status = await client.GetStatusAsync();
                Check.Equal(1u, status.Budget.MaxCpuThreads, "GetStatus shows the new cap");

                clock.Restart();
                while (!events.Exists(e => e.Reason == "budget" && e.Budget.MaxCpuThreads == 1) && clock.Elapsed < TimeSpan.FromSeconds(10))
                    await Task.Delay(20);
                Check.True(events.Exists(e => e.Reason == "budget" && e.Budget.MaxCpuThreads == 1), "WatchState reported the budget change");
                Check.Equal(0, offMainThread, "state events delivered off the main thread");

                stop.Cancel();
                await Check.Throws<OperationCanceledException>(() => watching, "a cancelled watch");
                var e2 = await Check.Throws<SidecarException>(() => client.SetBudgetAsync(SetBudgetRequest.Vram("two gigs")), "a budget that is not a size");
                Check.Equal(SidecarStatusCode.InvalidArgument, e2.Code, "code for a bad size");
                Check.True(e2.Message.StartsWith("SetBudget failed: INVALID_ARGUMENT: "), "the message names the call and code: " + e2.Message);
                await client.SetBudgetAsync(SetBudgetRequest.Vram("0", 0));
            }
        }

        static async Task BudgetCoalescing()
        {
            var counting = new CountingTransport(Env.Transport(Env.Token));
            using (var client = new SidecarClient(counting, SynchronizationContext.Current))
            {
                var updater = new BudgetUpdater(client);
                var first = updater.RequestAsync(SetBudgetRequest.Vram("0", 1));
                var second = updater.RequestAsync(SetBudgetRequest.Vram("0", 2));
                var third = updater.RequestAsync(SetBudgetRequest.Vram("0", 0));
                var results = await Task.WhenAll(first, second, third);
                Check.Equal(0u, results[2].Budget.MaxCpuThreads, "the newest request is in force");
                // A request still waiting when a newer one came completes with the newer one's result.
                var secondThreads = results[1].Budget.MaxCpuThreads;
                Check.True(secondThreads == 2 || ReferenceEquals(results[1], results[2]), "the second request's result is its own or its replacement's");
                Check.True(counting.Calls("SetBudget") <= 2, "three quick changes cost at most two SetBudget calls, not " + counting.Calls("SetBudget"));
                Check.True(ReferenceEquals(updater.Applied, results[2]), "Applied is the last confirmed budget");
                var status = await client.GetStatusAsync();
                Check.Equal(0u, status.Budget.MaxCpuThreads, "the daemon agrees");
            }
        }

        static async Task ScreenshotQuestion()
        {
            if (Environment.GetEnvironmentVariable("XLM_TEST_VISION") != "1")
                throw new AssertionFailed("run only with a daemon started with --mmproj (XLM_TEST_VISION=1)");
            using (var client = NewClient())
            {
                // A 64x48 RGBA8 frame as Unity reads it back: bottom row first, a gradient so rows differ.
                const int width = 64, height = 48;
                var pixels = new byte[width * height * 4];
                for (var y = 0; y < height; y++)
                    for (var x = 0; x < width; x++)
                    {
                        var i = (y * width + x) * 4;
                        pixels[i] = (byte)(x * 4);
                        pixels[i + 1] = (byte)(y * 5);
                        pixels[i + 2] = 128;
                        pixels[i + 3] = 255;
                    }
                var chunks = 0;
                var result = await client.AskImageAsync(new AskImageRequest
                {
                    Image = ImageInput.FromRaw(new RawImage { Pixels = pixels, Width = width, Height = height, Format = PixelFormat.Rgba8, BottomUp = true }),
                    Question = "What is on the screen?",
                    MaxTokens = 8,
                    Sampling = await NoEarlyEnd.Ban(client),
                }, chunk => chunks++);
                Check.True(chunks >= 1, "chunks arrived");
                Check.Equal(8u, result.Usage.CompletionTokens, "completion tokens");
                var image = result.Final.Image;
                Check.True(image != null, "the final chunk describes the image");
                Check.Equal((uint)width, image.OriginalWidth, "original width");
                Check.Equal((uint)height, image.OriginalHeight, "original height");
                Check.True(image.ImageTokens > 0, "the image became tokens");
                Check.True(result.Usage.PromptTokens > image.ImageTokens, "the prompt holds the image and the question");
            }
        }

        static async Task WrongToken()
        {
            using (var client = Env.Client("not-the-token-of-this-launch"))
            {
                var e = await Check.Throws<SidecarAuthenticationException>(() => client.GetStatusAsync(), "a wrong token");
                Check.Equal(SidecarStatusCode.Unauthenticated, e.Code, "code");
                Check.True(e.Message.Contains("UNAUTHENTICATED"), "the message says so: " + e.Message);
                // Every later call is refused the same way, not hung.
                await Check.Throws<SidecarAuthenticationException>(() => client.GenerateAsync(Greedy("hi", 2)), "a call after the refusal");
            }
        }

        static async Task Errors()
        {
            using (var client = NewClient())
            {
                var e = await Check.Throws<SidecarException>(() => client.GenerateAsync(new GenerateRequest { Prompt = "" }), "an empty prompt");
                Check.Equal(SidecarStatusCode.InvalidArgument, e.Code, "empty prompt");
                Check.Equal("Generate", e.Method, "the failed call");
                e = await Check.Throws<SidecarException>(() => client.GenerateAsync(Greedy("x", 100000)), "too many tokens");
                Check.Equal(SidecarStatusCode.InvalidArgument, e.Code, "max tokens over the daemon's limit");
                e = await Check.Throws<SidecarException>(() => client.GenerateAsync(new GenerateRequest { Prompt = "x", JsonSchema = "{not json" }), "a bad schema");
                Check.Equal(SidecarStatusCode.InvalidArgument, e.Code, "a schema that is not JSON");
                e = await Check.Throws<SidecarException>(() => client.EndSessionAsync("nobody-" + Guid.NewGuid().ToString("N")), "an unknown session");
                Check.Equal(SidecarStatusCode.NotFound, e.Code, "unknown session");
                await Check.Throws<ArgumentException>(() => client.GenerateAsync(new GenerateRequest()), "neither prompt nor messages");
            }
        }

        static async Task HandlerThrows()
        {
            using (var client = NewClient())
            {
                var e = await Check.Throws<InvalidOperationException>(
                    async () => await client.GenerateAsync(await Whole(client, Endless, Long), chunk => { throw new InvalidOperationException("the UI is gone"); }),
                    "a handler that throws");
                Check.Equal("the UI is gone", e.Message, "the handler's own exception");
                await WaitUntilIdle(client);
            }
        }

        static async Task NoDaemon()
        {
            using (var client = new SidecarClient(Env.Unreachable("some-token-nobody-checks"), SynchronizationContext.Current))
            {
                var clock = Stopwatch.StartNew();
                var e = await Check.Throws<SidecarUnavailableException>(() => client.GetStatusAsync(), "nothing listening");
                Check.True(clock.Elapsed < TimeSpan.FromSeconds(10), "refused at once");
                Check.True(e.Message.Contains("127.0.0.1:9"), "the message names the address: " + e.Message);
            }
        }
    }

    /// <summary>The real transport, counting the calls that go through it.</summary>
    sealed class CountingTransport : ISidecarTransport
    {
        readonly ISidecarTransport inner;
        readonly Dictionary<string, int> calls = new Dictionary<string, int>();

        public CountingTransport(ISidecarTransport inner) { this.inner = inner; }

        public int Calls(string method)
        {
            lock (calls)
            {
                int n;
                return calls.TryGetValue(method, out n) ? n : 0;
            }
        }

        void Count(string method)
        {
            lock (calls)
                calls[method] = Calls(method) + 1;
        }

        public string Address { get { return inner.Address; } }
        public Task ConnectAsync(CancellationToken ct) { return inner.ConnectAsync(ct); }

        public Task<JsonObject> CallAsync(string method, JsonObject request, CancellationToken ct)
        {
            Count(method);
            return inner.CallAsync(method, request, ct);
        }

        public Task StreamAsync(string method, JsonObject request, Action<JsonObject> onMessage, CancellationToken ct)
        {
            Count(method);
            return inner.StreamAsync(method, request, onMessage, ct);
        }

        public void Dispose() { inner.Dispose(); }
    }
}
