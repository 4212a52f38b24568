"""How the trainer's weights reach the rollout engines after each step (one version a push).

    trainer (TrainerService.weights: the live parameters, or a host copy from an FSDP gather)
      -> WeightPusher.push (pusher.py), transport per engine (placement.py, config.py):
         device_copy    engine in this process: copy_ into its parameters, cast on device
         shared_memory  engine process, same host, CPU: one segment, handle over the socket
         cuda_ipc       engine process, same host, GPU: one device buffer, IPC handle
         broadcast      engine process, other host: torch.distributed group, rank 0 the source
         socket         the bytes over the engine's socket (engine/remote/wire.py)
      -> Engine.update_weights: all tensors checked, then copied, then the version set

layout.py lays a push out in one flat buffer for the three handle transports."""
