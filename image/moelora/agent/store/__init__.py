"""S3 and the cache on disk: where an adapter's files are (source), getting them (transfer, fetch) with one
adapter's S3 trouble kept its own (guard, sockets), and keeping them (cache, last_good).

Knows nothing of vLLM, Kubernetes or the loop's plan; judges no file's content (that is check's, which the cache
asks for a directory's size only).
"""
