using System;
using UnityEngine;

namespace Xlm.Sidecar.Unity
{
    /// <summary>
    /// Reads a texture back as raw RGBA8 pixels for AskImage, scaled down on the GPU first: vision
    /// projectors see a few hundred pixels a side, and a full 4K frame would cost 33 MB per question
    /// (over the daemon's default message limit) for nothing.
    /// </summary>
    public static class FrameCapture
    {
        /// <summary>`source` (a RenderTexture, or any Texture the GPU can sample) scaled so its longer
        /// side is at most `maxSide`, as RGBA8 rows bottom first (Unity's ReadPixels order).
        /// Call on the main thread.</summary>
        public static RawImage ReadScaled(Texture source, int maxSide)
        {
            if (source == null)
                throw new ArgumentNullException("source");
            if (maxSide < 1)
                throw new ArgumentOutOfRangeException("maxSide", "at least 1 pixel");
            var scale = Math.Min(1.0, maxSide / (double)Math.Max(source.width, source.height));
            var width = Math.Max(1, (int)Math.Round(source.width * scale));
            var height = Math.Max(1, (int)Math.Round(source.height * scale));

            // sRGB: the model should see the colours the player sees.
            var scaled = RenderTexture.GetTemporary(width, height, 0, RenderTextureFormat.ARGB32, RenderTextureReadWrite.sRGB);
            var previous = RenderTexture.active;
            Texture2D readback = null;
            try
            {
                Graphics.Blit(source, scaled);
                RenderTexture.active = scaled;
                readback = new Texture2D(width, height, TextureFormat.RGBA32, false);
                readback.ReadPixels(new Rect(0, 0, width, height), 0, 0, false);
                return new RawImage
                {
                    Pixels = readback.GetRawTextureData(),
                    Width = (uint)width,
                    Height = (uint)height,
                    Stride = (uint)(width * 4),
                    Format = PixelFormat.Rgba8,
                    BottomUp = true,
                };
            }
            finally
            {
                RenderTexture.active = previous;
                RenderTexture.ReleaseTemporary(scaled);
                if (readback != null)
                    UnityEngine.Object.Destroy(readback);
            }
        }
    }
}
