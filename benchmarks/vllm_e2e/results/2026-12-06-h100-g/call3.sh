MODES="plugin.2 nolora.2" LIMIT=178 bash call2.sh  # call 3, same machine, 233 s of device time left
