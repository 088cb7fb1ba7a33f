using System;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar
{
    /// <summary>
    /// Runs callbacks on the SynchronizationContext captured when the client was made: in Unity the
    /// main thread's UnitySynchronizationContext, so handlers may touch UI and GameObjects. Without a
    /// context, callbacks run on the transport's thread.
    /// </summary>
    public sealed class EventDispatcher
    {
        readonly SynchronizationContext context;

        public EventDispatcher(SynchronizationContext context)
        {
            this.context = context;
        }

        public SynchronizationContext Context { get { return context; } }

        public void Post(Action action)
        {
            if (context == null)
                action();
            else
                context.Post(state => ((Action)state)(), action);
        }

        /// <summary>Completes once every callback posted before it has run (the context runs posts in order).</summary>
        public Task FlushAsync()
        {
            if (context == null)
                return Task.FromResult(true);
            var done = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
            context.Post(state => ((TaskCompletionSource<bool>)state).TrySetResult(true), done);
            return done.Task;
        }
    }
}
