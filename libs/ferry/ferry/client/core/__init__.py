"""The client library's shared core: connections, namesrv routes, message values, offset requests, replica choice, the PULL body decoder and the clients' spans."""
