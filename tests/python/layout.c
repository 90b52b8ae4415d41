/* gpumem-py-layout: the size, and every field's offset and size, of the public structs of gpumem-client.h as
 * the C compiler lays them out, one JSON object per line, for the Python binding's layout test. */
#include <stddef.h>
#include <stdio.h>

#include "gpumem-client.h"

#define BEGIN(T) printf("{\"struct\": \"%s\", \"size\": %zu, \"fields\": [", #T, sizeof(T))
#define F(T, f)                                                                                              \
        printf("%s[\"%s\", %zu, %zu]", first ? "" : ", ", #f, offsetof(T, f), sizeof(((T *)0)->f)), first = 0
#define END() printf("]}\n"), first = 1

int main(void)
{
        int first = 1;

        BEGIN(gm_client_options);
        F(gm_client_options, struct_size);
        F(gm_client_options, socket_path);
        F(gm_client_options, name);
        F(gm_client_options, window_size);
        F(gm_client_options, low_window);
        END();

        BEGIN(gm_property);
        F(gm_property, key);
        F(gm_property, value);
        END();

        BEGIN(gm_io_link);
        F(gm_io_link, type);
        F(gm_io_link, node_from);
        F(gm_io_link, node_to);
        F(gm_io_link, weight);
        F(gm_io_link, min_bandwidth);
        F(gm_io_link, max_bandwidth);
        END();

        BEGIN(gm_topology_node);
        F(gm_topology_node, node_id);
        F(gm_topology_node, gpu_id);
        F(gm_topology_node, name);
        F(gm_topology_node, is_gpu);
        F(gm_topology_node, cpu_cores);
        F(gm_topology_node, simd_count);
        F(gm_topology_node, local_mem_size);
        F(gm_topology_node, gfx_target_version);
        F(gm_topology_node, vendor_id);
        F(gm_topology_node, device_id);
        F(gm_topology_node, pci_domain);
        F(gm_topology_node, pci_location);
        F(gm_topology_node, drm_render_minor);
        F(gm_topology_node, hive_id);
        F(gm_topology_node, numa_node);
        F(gm_topology_node, large_bar);
        F(gm_topology_node, capability);
        F(gm_topology_node, system_mem_size);
        F(gm_topology_node, n_io_links);
        F(gm_topology_node, io_links);
        F(gm_topology_node, n_properties);
        F(gm_topology_node, properties);
        END();

        BEGIN(gm_topology);
        F(gm_topology, generation_id);
        F(gm_topology, n_nodes);
        F(gm_topology, nodes);
        END();

        BEGIN(gm_topology_file);
        F(gm_topology_file, path);
        F(gm_topology_file, content);
        F(gm_topology_file, len);
        END();

        BEGIN(gm_tile_config);
        F(gm_tile_config, gb_addr_config);
        F(gm_tile_config, num_banks);
        F(gm_tile_config, num_ranks);
        F(gm_tile_config, n_tile);
        F(gm_tile_config, n_macro);
        F(gm_tile_config, tile);
        F(gm_tile_config, macro);
        END();

        BEGIN(gm_alloc_desc);
        F(gm_alloc_desc, kind);
        F(gm_alloc_desc, size);
        F(gm_alloc_desc, gpu_id);
        F(gm_alloc_desc, flags);
        F(gm_alloc_desc, numa_node);
        F(gm_alloc_desc, alignment);
        F(gm_alloc_desc, fixed_addr);
        F(gm_alloc_desc, map_gpus);
        F(gm_alloc_desc, n_map_gpus);
        END();

        BEGIN(gm_pointer_attributes);
        F(gm_pointer_attributes, struct_size);
        F(gm_pointer_attributes, handle);
        F(gm_pointer_attributes, kind);
        F(gm_pointer_attributes, gpu_id);
        F(gm_pointer_attributes, base);
        F(gm_pointer_attributes, size);
        F(gm_pointer_attributes, flags);
        F(gm_pointer_attributes, cpu_accessible);
        F(gm_pointer_attributes, n_mapped_gpus);
        F(gm_pointer_attributes, mapped_gpus);
        END();

        BEGIN(gm_svm_attr);
        F(gm_svm_attr, type);
        F(gm_svm_attr, value);
        END();

        BEGIN(gm_access_desc);
        F(gm_access_desc, gpu_id);
        F(gm_access_desc, access);
        END();

        BEGIN(gm_allocation_prop);
        F(gm_allocation_prop, struct_size);
        F(gm_allocation_prop, kind);
        F(gm_allocation_prop, gpu_id);
        F(gm_allocation_prop, size);
        F(gm_allocation_prop, flags);
        END();

        BEGIN(gm_status);
        F(gm_status, server_version);
        F(gm_status, backend);
        F(gm_status, preset);
        F(gm_status, protocol_version);
        F(gm_status, kfd_major);
        F(gm_status, kfd_minor);
        F(gm_status, uptime_usec);
        F(gm_status, started_usec);
        F(gm_status, pid);
        F(gm_status, clients);
        F(gm_status, gpus);
        F(gm_status, allocations);
        F(gm_status, bytes_device);
        F(gm_status, bytes_host);
        F(gm_status, bytes_managed);
        F(gm_status, requests);
        F(gm_status, protocol_errors);
        F(gm_status, va_windows);
        F(gm_status, has_model);
        F(gm_status, model_contexts);
        F(gm_status, model_buffers);
        F(gm_status, model_handles);
        F(gm_status, model_imports);
        F(gm_status, model_mappings);
        F(gm_status, model_gem_handles);
        F(gm_status, model_svm_ranges);
        F(gm_status, model_system_bytes);
        F(gm_status, model_vram_bytes);
        F(gm_status, has_private_gpu_vm);
        F(gm_status, private_gpu_vm);
        END();

        BEGIN(gm_gpu_usage);
        F(gm_gpu_usage, gpu_id);
        F(gm_gpu_usage, vram_bytes);
        END();

        BEGIN(gm_client_info);
        F(gm_client_info, client_id);
        F(gm_client_info, pid);
        F(gm_client_info, uid);
        F(gm_client_info, gid);
        F(gm_client_info, cgroup);
        F(gm_client_info, container);
        F(gm_client_info, name);
        F(gm_client_info, class_name);
        F(gm_client_info, connected_usec);
        F(gm_client_info, host_bytes);
        F(gm_client_info, managed_bytes);
        F(gm_client_info, handles);
        F(gm_client_info, fds);
        F(gm_client_info, requests);
        F(gm_client_info, admin);
        F(gm_client_info, n_usage);
        F(gm_client_info, usage);
        F(gm_client_info, pod);
        END();

        BEGIN(gm_alloc_info);
        F(gm_alloc_info, client_id);
        F(gm_alloc_info, id);
        F(gm_alloc_info, kind);
        F(gm_alloc_info, size);
        F(gm_alloc_info, gpu_id);
        F(gm_alloc_info, va);
        F(gm_alloc_info, n_mapped_gpus);
        F(gm_alloc_info, mapped_gpus);
        F(gm_alloc_info, exports);
        END();

        BEGIN(gm_quota);
        F(gm_quota, class_name);
        F(gm_quota, resource);
        F(gm_quota, gpu_id);
        F(gm_quota, limit);
        F(gm_quota, used);
        END();

        BEGIN(gm_share_info);
        F(gm_share_info, name);
        F(gm_share_info, owner_client_id);
        F(gm_share_info, owner_class);
        F(gm_share_info, kind);
        F(gm_share_info, gpu_id);
        F(gm_share_info, size);
        F(gm_share_info, ptr);
        F(gm_share_info, read_only);
        F(gm_share_info, persistent);
        F(gm_share_info, readers);
        F(gm_share_info, published_usec);
        F(gm_share_info, opens);
        END();
        return 0;
}
