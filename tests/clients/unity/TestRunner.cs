using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar.Tests
{
    /// <summary>
    /// A tiny test runner: `tests.exe NAME...` runs the named tests (all with none), each inside a
    /// single-threaded SynchronizationContext that stands in for Unity's main thread, prints
    /// PASS/FAIL lines and exits with the number of failures. pytest drives it (test_unity_client.py).
    /// </summary>
    public static class TestRunner
    {
        static readonly Dictionary<string, Func<Task>> Tests = new Dictionary<string, Func<Task>>(StringComparer.Ordinal);
        static readonly TimeSpan PerTest = TimeSpan.FromSeconds(120);

        public static void Add(string name, Func<Task> test)
        {
            Tests.Add(name, test);
        }

        /// <summary>Runs the registered tests named in `args` (all with none); `--list` names them.</summary>
        public static int Run(string[] args)
        {
            if (args.Length == 1 && args[0] == "--list")
            {
                foreach (var name in Tests.Keys)
                    Console.WriteLine(name);
                return 0;
            }
            var selected = args.Length > 0 ? new List<string>(args) : new List<string>(Tests.Keys);
            var failures = 0;
            foreach (var name in selected)
            {
                Func<Task> test;
                if (!Tests.TryGetValue(name, out test))
                {
                    Console.WriteLine("FAIL " + name + ": no such test");
                    failures++;
                    continue;
                }
                var clock = Stopwatch.StartNew();
                try
                {
                    MainThread.Run(test, PerTest);
                    Console.WriteLine("PASS " + name + " (" + clock.ElapsedMilliseconds + " ms)");
                }
                catch (Exception e)
                {
                    Console.WriteLine("FAIL " + name + " (" + clock.ElapsedMilliseconds + " ms): " + e);
                    failures++;
                }
            }
            Console.Out.Flush();
            return failures;
        }
    }

    /// <summary>
    /// A single-threaded SynchronizationContext that runs posted work in order on the thread that
    /// called Run, as Unity's UnitySynchronizationContext does on the main thread.
    /// </summary>
    public sealed class MainThread : SynchronizationContext
    {
        readonly BlockingCollection<KeyValuePair<SendOrPostCallback, object>> queue =
            new BlockingCollection<KeyValuePair<SendOrPostCallback, object>>();
        readonly int threadId = Thread.CurrentThread.ManagedThreadId;

        public static MainThread Active { get { return SynchronizationContext.Current as MainThread; } }

        public static bool IsCurrent
        {
            get
            {
                var c = Active;
                return c != null && c.threadId == Thread.CurrentThread.ManagedThreadId;
            }
        }

        public override void Post(SendOrPostCallback d, object state)
        {
            try
            {
                queue.Add(new KeyValuePair<SendOrPostCallback, object>(d, state));
            }
            catch (InvalidOperationException)
            {
                // The test is over; late work has nowhere to run.
            }
        }

        public override void Send(SendOrPostCallback d, object state)
        {
            throw new NotSupportedException("Send would block the main thread");
        }

        public static void Run(Func<Task> body, TimeSpan timeout)
        {
            var previous = SynchronizationContext.Current;
            var context = new MainThread();
            SynchronizationContext.SetSynchronizationContext(context);
            try
            {
                var task = body();
                task.ContinueWith(t => context.queue.CompleteAdding(), TaskScheduler.Default);
                var deadline = DateTime.UtcNow + timeout;
                KeyValuePair<SendOrPostCallback, object> item;
                while (!context.queue.IsCompleted)
                {
                    var left = deadline - DateTime.UtcNow;
                    if (left <= TimeSpan.Zero)
                        throw new TimeoutException("test did not finish within " + timeout.TotalSeconds + " s");
                    if (context.queue.TryTake(out item, left))
                        item.Key(item.Value);
                }
                task.GetAwaiter().GetResult();
            }
            finally
            {
                SynchronizationContext.SetSynchronizationContext(previous);
            }
        }
    }

    public sealed class AssertionFailed : Exception
    {
        public AssertionFailed(string message) : base(message) { }
    }

    public static class Check
    {
        public static void True(bool condition, string what)
        {
            if (!condition)
                throw new AssertionFailed(what);
        }

        public static void Equal<T>(T expected, T actual, string what)
        {
            if (!EqualityComparer<T>.Default.Equals(expected, actual))
                throw new AssertionFailed(what + ": expected <" + expected + ">, got <" + actual + ">");
        }

        /// <summary>Awaits `call` and returns the exception of type T it must throw.</summary>
        public static async Task<T> Throws<T>(Func<Task> call, string what) where T : Exception
        {
            try
            {
                await call();
            }
            catch (T e)
            {
                return e;
            }
            catch (Exception e)
            {
                throw new AssertionFailed(what + ": expected " + typeof(T).Name + ", got " + e.GetType().Name + ": " + e.Message);
            }
            throw new AssertionFailed(what + ": expected " + typeof(T).Name + ", but it succeeded");
        }
    }

    /// <summary>What pytest passes in the environment.</summary>
    public static partial class Env
    {
        public static string Get(string name)
        {
            var value = Environment.GetEnvironmentVariable(name);
            if (string.IsNullOrEmpty(value))
                throw new AssertionFailed("the test needs " + name + " in the environment");
            return value;
        }

        public static string WebSocketAddress { get { return Get("XLM_TEST_WS"); } }
        public static string Token { get { return Get("XLM_TEST_TOKEN"); } }
    }

    /// <summary>
    /// A reply that runs to MaxTokens by mechanism, not by prediction: the tiny random llama may end
    /// any reply at any token, and where differs by CPU (kernels round otherwise) and by seed, so a
    /// test that needs the whole length (a count, FinishReason.Length, a stream still running when it
    /// is cancelled) bans the model's end-of-generation tokens. The ids are the served model's own,
    /// found the way tests/support/no_early_stop.py finds them: the end texts that tokenize, control tokens
    /// parsed, to a single token.
    /// </summary>
    public static class NoEarlyEnd
    {
        static readonly string[] EndTexts = { "<|im_end|>", "<|endoftext|>", "<reponame>" };

        public static async Task<int[]> Ids(SidecarClient client)
        {
            var ids = new List<int>();
            foreach (var text in EndTexts)
            {
                var tokens = await client.TokenizeAsync(text, parseSpecial: true);
                if (tokens.Length == 1 && !ids.Contains(tokens[0]))
                    ids.Add(tokens[0]);
            }
            Check.True(ids.Count > 0, "the served model has an end-of-generation token to ban");
            return ids.ToArray();
        }

        /// <summary>`sampling` (greedy when null) with every end-of-generation token banned.</summary>
        public static async Task<SamplingParams> Ban(SidecarClient client, SamplingParams sampling = null)
        {
            sampling = sampling ?? new SamplingParams { Temperature = 0 };
            foreach (var id in await Ids(client))
                sampling.Ban(id);
            return sampling;
        }
    }
}
